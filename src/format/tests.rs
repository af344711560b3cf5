//! Tests of the header rules: one per [`FormatError`] variant from hand-written headers, the
//! deliberate leniencies of the reference, round trips through the writer, and never-panic
//! properties over random and mutated input.

use std::collections::BTreeMap;
use std::io;

use proptest::prelude::*;

use super::parse::{FastHeader, HashMetadata};
use super::writer::serialize;
use super::*;

/// Reads from bytes in memory, so tests exercise `read_header` exactly as a file would.
fn parse_file(bytes: &[u8]) -> Result<Header, FormatError> {
    let read_at = |buf: &mut [u8], offset: u64| {
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let end = start.checked_add(buf.len()).ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(bytes.get(start..end).ok_or(io::ErrorKind::UnexpectedEof)?);
        Ok(())
    };
    read_header(read_at, bytes.len() as u64)
}

/// Bytes of a file: the length prefix, `json` verbatim, then `data_len` data bytes.
fn file(json: &[u8], data_len: usize) -> Vec<u8> {
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json);
    out.resize(out.len() + data_len, 0xAB);
    out
}

fn parse(json: &str, data_len: usize) -> Result<Header, FormatError> {
    parse_file(&file(json.as_bytes(), data_len))
}

fn json_message(result: Result<Header, FormatError>) -> String {
    match result {
        Err(FormatError::InvalidJson { message }) => message,
        other => panic!("expected InvalidJson, got {other:?}"),
    }
}

fn names(header: &Header) -> Vec<&str> {
    header.tensors.iter().map(|t| t.name.as_str()).collect()
}

#[test]
fn header_too_small() {
    for len in [0, 7] {
        match parse_file(&vec![0u8; len]) {
            Err(FormatError::HeaderTooSmall { file_len }) => assert_eq!(file_len, len as u64),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn header_too_large_is_checked_before_the_file_length() {
    for declared in [MAX_HEADER_SIZE + 1, u64::MAX] {
        let mut bytes = declared.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        match parse_file(&bytes) {
            Err(FormatError::HeaderTooLarge { declared: d, limit }) => {
                assert_eq!((d, limit), (declared, MAX_HEADER_SIZE))
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn header_length_past_end() {
    let mut bytes = 100u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{\"a\":");
    match parse_file(&bytes) {
        Err(FormatError::HeaderLengthPastEnd { declared: 100, file_len: 13 }) => {}
        other => panic!("{other:?}"),
    }
    match parse_header(b"{}", 9) {
        Err(FormatError::HeaderLengthPastEnd { declared: 2, file_len: 9 }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn invalid_utf8() {
    match parse_file(&file(b"{\"a\xff\":1}", 0)) {
        Err(FormatError::InvalidUtf8 { error }) => assert_eq!(error.valid_up_to(), 3),
        other => panic!("{other:?}"),
    }
}

#[test]
fn invalid_json_keeps_serde_messages() {
    let cases = [
        (r#"{"__metadata__":{},"__metadata__":{}}"#, "duplicate field `__metadata__`"),
        (r#"{"__metadata__":{"x":1}}"#, "invalid type: integer `1`, expected a string"),
        (r#"{"__metadata__":["x"]}"#, "expected a map"),
        (r#"{"a":{"dtype":"f32","shape":[],"data_offsets":[0,4]}}"#, "unknown variant `f32`"),
        (r#"{"a":{"dtype":"F32","data_offsets":[0,4]}}"#, "missing field `shape`"),
        (r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#, "expected u64"),
        (r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#, "invalid length 3"),
        (r#"[]"#, "invalid type: sequence, expected struct HashMetadata"),
        ("{}\0\0", "trailing characters"),
    ];
    for (json, needle) in cases {
        let message = json_message(parse(json, 4));
        assert!(message.contains(needle), "{json}: {message}");
    }
}

#[test]
fn invalid_json_message_escapes_hostile_dtype_names() {
    let json = r#"{"a":{"dtype":"\u001b[31m","shape":[],"data_offsets":[0,0]}}"#;
    let message = json_message(parse(json, 0));
    assert!(!message.contains('\u{1b}'), "{message}");
    assert!(message.contains("\\u{1b}[31m"), "{message}");
}

#[test]
fn offset_reversed() {
    let json = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                   "b":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}"#;
    match parse(json, 4) {
        Err(FormatError::OffsetReversed { tensor, begin: 4, end: 0 }) => {
            assert_eq!(tensor, "b")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn offset_gap_at_start_and_between_tensors() {
    let first = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#;
    match parse(first, 8) {
        Err(FormatError::OffsetGap { tensor, expected: 0, found: 4 }) => {
            assert_eq!(tensor, "a")
        }
        other => panic!("{other:?}"),
    }
    let between = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                      "b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}}"#;
    let err = parse(between, 10).unwrap_err();
    let gap = matches!(&err, FormatError::OffsetGap { tensor, expected: 4, found: 6 } if tensor == "b");
    assert!(gap, "{err:?}");
    assert_eq!(err.to_string(), "tensor `b` starts at 6, expected 4 (a hole of 2 bytes)");
}

/// A repeated key keeps its last entry (serde map semantics, as in the reference), so the
/// first entry's bytes become a hole.
#[test]
fn duplicate_name_with_different_offsets_leaves_a_gap() {
    let json = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                   "a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#;
    match parse(json, 8) {
        Err(FormatError::OffsetGap { tensor, expected: 0, found: 4 }) => {
            assert_eq!(tensor, "a")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn offset_overlap() {
    let json = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                   "b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    match parse(json, 8) {
        Err(FormatError::OffsetOverlap { tensor, expected: 8, found: 4 }) => {
            assert_eq!(tensor, "b")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn shape_overflow_in_elements_and_in_bits() {
    let elements = r#"{"a":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}}"#;
    let bits = r#"{"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}}"#;
    for json in [elements, bits] {
        match parse(json, 0) {
            Err(FormatError::ShapeOverflow { tensor }) => assert_eq!(tensor, "a"),
            other => panic!("{json}: {other:?}"),
        }
    }
}

#[test]
fn misaligned_bits() {
    let json = r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#;
    match parse(json, 2) {
        Err(FormatError::MisalignedBits { tensor, bits: 12 }) => assert_eq!(tensor, "a"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn length_mismatch() {
    let json = r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}}"#;
    match parse(json, 12) {
        Err(FormatError::LengthMismatch { tensor, expected: 16, found: 12 }) => {
            assert_eq!(tensor, "w")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn incomplete_data_truncated_and_trailing() {
    let json = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
    let data_start = N_LEN + json.len() as u64;
    let err = parse(json, 3).unwrap_err();
    assert!(matches!(err, FormatError::IncompleteData { data_len: 4, .. }), "{err:?}");
    assert!(err.to_string().contains("truncated"), "{err}");
    let err = parse(json, 6).unwrap_err();
    match &err {
        FormatError::IncompleteData { data_start: s, data_len: 4, file_len } => {
            assert_eq!((*s, *file_len), (data_start, data_start + 6))
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().starts_with("2 trailing bytes"), "{err}");
    assert!(matches!(parse("{}", 4), Err(FormatError::IncompleteData { data_len: 0, .. })));
}

#[test]
fn incomplete_data_message_survives_offsets_near_u64_max() {
    // Eight tensors of 2^61 - 1 bytes each end at 2^64 - 8, so `8 + N + end` overflows.
    let size = (1u64 << 61) - 1;
    let entries: Vec<String> = (0..8u64)
        .map(|i| {
            let (begin, end) = (i * size, (i + 1) * size);
            let entry = r#"{"dtype":"U8","shape":[SIZE],"data_offsets":[BEGIN,END]}"#;
            let entry = entry.replace("SIZE", &size.to_string());
            let entry = entry.replace("BEGIN", &begin.to_string());
            format!("\"t{i}\":{}", entry.replace("END", &end.to_string()))
        })
        .collect();
    let err = parse(&format!("{{{}}}", entries.join(",")), 0).unwrap_err();
    assert!(matches!(err, FormatError::IncompleteData { .. }), "{err:?}");
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn io_errors_carry_the_failed_read() {
    match read_header(|_, _| Err(io::Error::other("disk on fire")), 100) {
        Err(FormatError::Io { offset: 0, len: 8, error }) => {
            assert_eq!(error.to_string(), "disk on fire")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn messages_escape_control_characters_and_cut_long_names() {
    let err = FormatError::ShapeOverflow { tensor: "a\0b\u{1b}[2J\n".into() };
    assert_eq!(err.to_string(), "tensor `a\\0b\\u{1b}[2J\\n` has a shape whose element or bit count overflows 64 bits");
    let long = "é".repeat(300);
    let shown = FormatError::ShapeOverflow { tensor: long }.to_string();
    assert!(shown.contains(&format!("{}…[400 more bytes]`", "é".repeat(100))), "{shown}");
}

/// Writers may pad before the JSON to align the data section (reference PR #686).
#[test]
fn leading_whitespace_is_accepted() {
    let header = parse(" \n\t{}", 0).unwrap();
    assert_eq!(header.header_len, 5);
    assert!(header.tensors.is_empty());
}

/// The reference writer pads with spaces; other JSON whitespace is accepted too.
#[test]
fn trailing_whitespace_padding_is_accepted() {
    let json = "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}} \r\n\t   ";
    let header = parse(json, 2).unwrap();
    assert_eq!(header.data_start(), N_LEN + json.len() as u64);
    let start = header.data_start();
    assert_eq!(header.tensor_range(&header.tensors[0]), start..start + 2);
}

/// serde's map keeps the last of two identical entries, as the reference does.
#[test]
fn identical_duplicate_keys_are_accepted() {
    let entry = r#"{"dtype":"U8","shape":[2],"data_offsets":[0,2]}"#;
    let header = parse(&format!("{{\"a\":{entry},\"a\":{entry}}}"), 2).unwrap();
    assert_eq!(names(&header), ["a"]);
}

/// The reference does not deny unknown fields, whatever the JSON schema says.
#[test]
fn extra_fields_in_entries_are_ignored() {
    let json = r#"{"a":{"foo":[1,{"x":null}],"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
    assert_eq!(names(&parse(json, 1).unwrap()), ["a"]);
}

#[test]
fn null_and_present_metadata() {
    assert_eq!(parse(r#"{"__metadata__":null}"#, 0).unwrap().metadata, None);
    let header = parse(r#"{"__metadata__":{"format":"pt","b":""}}"#, 0).unwrap();
    let expected = BTreeMap::from([("b".into(), String::new()), ("format".into(), "pt".into())]);
    assert_eq!(header.metadata, Some(expected));
}

#[test]
fn zero_size_tensors_share_an_offset_and_sort_by_name() {
    let json = r#"{"z":{"dtype":"F32","shape":[0,5],"data_offsets":[0,0]},
                   "b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},
                   "a":{"dtype":"I64","shape":[3,0],"data_offsets":[0,0]}}"#;
    let header = parse(json, 2).unwrap();
    assert_eq!(names(&header), ["a", "z", "b"]);
}

#[test]
fn scalar_and_sub_byte_shapes() {
    let scalar = parse(r#"{"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}}"#, 8).unwrap();
    assert_eq!(scalar.tensors[0].shape, Vec::<u64>::new());
    let f4 = parse(r#"{"q":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}}"#, 2).unwrap();
    assert_eq!(f4.tensors[0].byte_len(), 2);
    let f6 = parse(r#"{"q":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}}"#, 3).unwrap();
    assert_eq!(f6.tensors[0].byte_len(), 3);
}

#[test]
fn empty_object_with_no_data() {
    let header = parse("{}", 0).unwrap();
    assert_eq!((header.header_len, header.file_len), (2, 10));
    assert!(header.tensors.is_empty() && header.metadata.is_none());
}

type Tensors = BTreeMap<String, (Dtype, Vec<u64>, Vec<u8>)>;

/// Valid tensors: small shapes, a dimension of 8 added where sub-byte dtypes need it.
fn arb_tensors() -> impl Strategy<Value = Tensors> {
    let dtype = proptest::sample::select(Dtype::ALL.to_vec());
    let tensor = (dtype, prop::collection::vec(0u64..5, 0..4), any::<u8>()).prop_map(|(dtype, mut shape, seed)| {
        if shape.iter().product::<u64>() * dtype.bitsize() % 8 != 0 {
            shape.push(8);
        }
        let len = shape.iter().product::<u64>() * dtype.bitsize() / 8;
        let data = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
        (dtype, shape, data)
    });
    let name = "[^\n]{0,12}".prop_filter("reserved key", |n| n != "__metadata__");
    prop::collection::btree_map(name, tensor, 0..6)
}

fn arb_metadata() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    prop::option::of(prop::collection::btree_map("[^\n]{0,8}", "[^\n]{0,8}", 0..3))
}

fn write(tensors: &Tensors, metadata: Option<&BTreeMap<String, String>>) -> Vec<u8> {
    let list: Vec<_> = tensors
        .iter()
        .map(|(name, (dtype, shape, data))| (name.clone(), *dtype, shape.clone(), data.clone()))
        .collect();
    serialize(&list, metadata).unwrap()
}

/// Cases for the never-panic properties; CI raises it through `STFS_FUZZ_CASES`.
fn fuzz_cases() -> u32 {
    std::env::var("STFS_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000)
}

/// Pieces of plausible and hostile headers, so random headers reach the validator often.
const JSON_TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    " ",
    "null",
    "\"a\"",
    "\"b\"",
    "\"__metadata__\"",
    "\"dtype\"",
    "\"F32\"",
    "\"F4\"",
    "\"U8\"",
    "\"shape\"",
    "\"data_offsets\"",
    "0",
    "1",
    "2",
    "4",
    "8",
    "3",
    "-1",
    "1.5",
    "1e400",
    "18446744073709551615",
    "18446744073709551616",
    "\"\\u0000\"",
    "\"x\"",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn written_files_parse_back_to_the_same_tensors(
        tensors in arb_tensors(),
        metadata in arb_metadata(),
    ) {
        let bytes = write(&tensors, metadata.as_ref());
        let header = parse_file(&bytes).unwrap();
        prop_assert_eq!(header.data_start() % 8, 0);
        prop_assert_eq!(&header.metadata, &metadata);
        let mut parsed = Tensors::new();
        for t in &header.tensors {
            let range = header.tensor_range(t);
            let data = bytes[range.start as usize..range.end as usize].to_vec();
            parsed.insert(t.name.clone(), (t.dtype, t.shape.clone(), data));
        }
        prop_assert_eq!(parsed, tensors);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: fuzz_cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = parse_file(&bytes);
    }

    #[test]
    fn random_token_headers_never_panic(
        tokens in prop::collection::vec(proptest::sample::select(JSON_TOKENS), 0..64),
        data_len in 0usize..12,
    ) {
        let _ = parse_file(&file(tokens.concat().as_bytes(), data_len));
    }

    /// The fast deserializer and the reference-shaped one accept exactly the same documents.
    #[test]
    fn fast_and_reference_deserializers_agree(
        tokens in prop::collection::vec(proptest::sample::select(JSON_TOKENS), 0..64),
        tensors in arb_tensors(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut valid = write(&tensors, None);
        let n = 8 + u64::from_le_bytes(valid[..8].try_into().unwrap()) as usize;
        let at = 8 + at.index(n - 8);
        valid[at] = byte;
        for doc in [tokens.concat().into_bytes(), valid[8..n].to_vec()] {
            let Ok(text) = std::str::from_utf8(&doc) else { continue };
            let fast = serde_json::from_str::<FastHeader>(text).map(|h| (h.metadata, h.tensors.into_iter().map(|(k, t)| (k, t.dtype, t.shape, t.data_offsets)).collect::<Vec<_>>()));
            let reference = serde_json::from_str::<HashMetadata>(text).map(|h| (h.metadata, h.tensors.into_iter().map(|(k, t)| (k, t.dtype, t.shape, t.data_offsets)).collect::<Vec<_>>()));
            prop_assert_eq!(fast.ok(), reference.ok(), "{}", text);
        }
    }

    #[test]
    fn mutated_valid_files_never_panic(
        tensors in arb_tensors(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = write(&tensors, None);
        let at = at.index(bytes.len());
        if truncate {
            bytes.truncate(at);
        } else {
            bytes[at] = byte;
        }
        let _ = parse_file(&bytes);
    }
}

#[test]
fn pytorch_checkpoints_are_named_only_when_the_length_is_refused() {
    let mut zip = b"PK\x03\x04\x14\x00\x00\x00".to_vec();
    zip.resize(300, 0);
    assert!(matches!(parse_file(&zip), Err(FormatError::PyTorch { format: PyTorchFormat::Zip })));
    let mut pickle = vec![0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46];
    pickle.resize(300, b'.');
    let err = parse_file(&pickle).unwrap_err();
    assert!(err.to_string().starts_with("not a safetensors file: it looks like a PyTorch checkpoint"), "{err}");
    // A 640-byte header's length prefix is `80 02 00 ...`, a protocol 2 pickle's start: still valid.
    let json = format!("{{\"__metadata__\":{{\"pad\":\"{}\"}}}}", "x".repeat(640 - 27));
    assert_eq!(json.len(), 640);
    let header = parse_file(&file(json.as_bytes(), 0)).unwrap();
    assert_eq!(header.header_len, 640);
}
