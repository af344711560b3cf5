//! `stfs extract` failing where it writes: one line naming the output file, as the user can read it.

mod common;

use common::*;
use stfs::format::Dtype;

/// The one stderr line of a command that must fail with status 1.
fn one_failure_line(out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!((out.status.code(), err.lines().count()), (Some(1), 1), "{err}");
    err.trim_end().to_string()
}

/// A disk that fills up names the file that could not be written (not the checkpoint, nor the
/// temporary name, which is removed): `stfs: OUT/w: no space left on device`, status 1, and
/// nothing is left in the output directory.
#[test]
fn a_full_disk_is_one_line_naming_the_output_file() {
    let dir = workdir();
    let file = dir.path().join("m.safetensors");
    write_checkpoint(&file, &[T::new("w", Dtype::F32, &[512 * 1024])], None);
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let _detach = DetachAll(vec![out_dir.clone()]);
    mount_tmpfs(&out_dir);
    let out = stfs(&["extract", file.to_str().unwrap(), "w", "-o", out_dir.to_str().unwrap()]);
    let line = one_failure_line(&out);
    assert_eq!(line, format!("stfs: {}/w: no space left on device", out_dir.display()));
    assert_eq!(std::fs::read_dir(&out_dir).unwrap().count(), 0, "a partial file was left behind");
}

/// A tensor name may hold control characters; an error about its output file shows them escaped,
/// so a hostile checkpoint cannot drive the terminal through extract's error line.
#[test]
fn an_error_about_an_output_file_escapes_the_tensor_name() {
    let dir = workdir();
    let file = dir.path().join("m.safetensors");
    let name = "d\u{1b}[31me\u{202e}x";
    write_checkpoint(&file, &[T::new(name, Dtype::U8, &[3])], None);
    let out_dir = dir.path().join("out");
    // A directory where the tensor's file would go: the rename into place fails.
    std::fs::create_dir_all(out_dir.join(name)).unwrap();
    let out = stfs(&["extract", file.to_str().unwrap(), name, "-o", out_dir.to_str().unwrap()]);
    let line = one_failure_line(&out);
    assert!(!line.contains('\u{1b}') && !line.contains('\u{202e}'), "{line:?}");
    let expected = format!("stfs: {}/d\\u{{1b}}[31me\\u{{202e}}x: is a directory", out_dir.display());
    assert_eq!(line, expected);
}

/// `-o` naming a file is "not a directory" (std said "file exists"); a file that cannot be
/// created (a filesystem out of inodes) names the output file, not the temporary name.
#[test]
fn an_output_dir_that_is_a_file_or_out_of_inodes_is_named_plainly() {
    let dir = workdir();
    let file = dir.path().join("m.safetensors");
    write_checkpoint(&file, &[T::new("w", Dtype::U8, &[3])], None);
    let out = stfs(&["extract", file.to_str().unwrap(), "w", "-o", file.to_str().unwrap()]);
    assert_eq!(one_failure_line(&out), format!("stfs: {}: not a directory", file.display()));

    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let _detach = DetachAll(vec![out_dir.clone()]);
    let c = |s: &[u8]| std::ffi::CString::new(s).unwrap();
    let target = c(out_dir.as_os_str().as_encoded_bytes());
    // One inode, the root's: creating any file there fails with ENOSPC.
    let (fs_type, data) = (c(b"tmpfs"), c(b"size=1m,nr_inodes=1"));
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::mount(fs_type.as_ptr(), target.as_ptr(), fs_type.as_ptr(), 0, data.as_ptr().cast()) };
    assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
    let out = stfs(&["extract", file.to_str().unwrap(), "w", "-o", out_dir.to_str().unwrap()]);
    assert_eq!(one_failure_line(&out), format!("stfs: {}/w: no space left on device", out_dir.display()));
}
