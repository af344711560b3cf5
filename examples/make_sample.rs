//! Writes `examples/sample.safetensors`, the small checkpoint the README's first command mounts:
//! a toy transformer (embeddings, two layers, a norm and a head) in F32, BF16 and F16, with
//! deterministic contents. Run: `cargo run --example make_sample -- examples/sample.safetensors`.

use std::collections::BTreeMap;

use stfs::format::Dtype;

/// A smooth deterministic signal, so `od -t f4` shows readable numbers.
fn values(seed: u32, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 * 0.37 + seed as f32).sin() * 0.5).round_ties_even_to(1e-4)).collect()
}

trait Round {
    fn round_ties_even_to(self, step: f32) -> f32;
}

impl Round for f32 {
    fn round_ties_even_to(self, step: f32) -> f32 {
        (self / step).round_ties_even() * step
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Truncating F32 to its upper half is a valid (round-toward-zero) BF16.
fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes()).collect()
}

fn main() {
    let out = std::env::args().nth(1).unwrap_or_else(|| "examples/sample.safetensors".into());
    let (vocab, hidden, ffn) = (64u64, 32u64, 96u64);
    let mut tensors: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> = Vec::new();
    let mut add = |name: &str, dtype: Dtype, shape: Vec<u64>, seed: u32| {
        let n = shape.iter().product::<u64>() as usize;
        let v = values(seed, n);
        let bytes = match dtype {
            Dtype::BF16 => bf16_bytes(&v),
            _ => f32_bytes(&v),
        };
        tensors.push((name.to_string(), dtype, shape, bytes));
    };
    add("model.embed_tokens.weight", Dtype::F32, vec![vocab, hidden], 1);
    for layer in 0..2u32 {
        let p = format!("model.layers.{layer}");
        add(&format!("{p}.self_attn.q_proj.weight"), Dtype::BF16, vec![hidden, hidden], 10 + layer);
        add(&format!("{p}.self_attn.k_proj.weight"), Dtype::BF16, vec![hidden, hidden], 20 + layer);
        add(&format!("{p}.mlp.up_proj.weight"), Dtype::BF16, vec![ffn, hidden], 30 + layer);
        add(&format!("{p}.mlp.down_proj.weight"), Dtype::BF16, vec![hidden, ffn], 40 + layer);
        add(&format!("{p}.input_layernorm.weight"), Dtype::F32, vec![hidden], 50 + layer);
    }
    add("model.norm.weight", Dtype::F32, vec![hidden], 60);
    add("lm_head.weight", Dtype::F32, vec![vocab, hidden], 70);
    let metadata = BTreeMap::from([
        ("format".to_string(), "pt".to_string()),
        ("made_by".to_string(), "examples/make_sample.rs".to_string()),
    ]);
    let bytes = stfs::format::writer::serialize(&tensors, Some(&metadata)).expect("valid sample");
    std::fs::write(&out, bytes).expect("write sample");
    println!("wrote {out} ({} tensors)", tensors.len());
}
