//! ioctl on a served file: answered ENOTTY ("not a terminal", what a regular file gives), quietly.
//! Python's `open()` asks every file whether it is a terminal (`TCGETS`, cmd 21505); fuser's
//! default answer logged a multi-line `[Not Implemented] ioctl` warning each time.

mod common;

use std::os::fd::AsRawFd;

use common::*;
use stfs::format::Dtype;

#[test]
fn ioctl_is_enotty_and_logs_nothing() {
    let dir = workdir();
    let file = dir.path().join("model.safetensors");
    let tensors = [T::new("w", Dtype::F32, &[1000])];
    write_checkpoint(&file, &tensors, None);
    let log = dir.path().join("stfs.log");
    let m = Mount::new(&file, &["--log-file", log.to_str().unwrap()]);
    for name in ["w", "metadata.json"] {
        let f = std::fs::File::open(m.file(name)).unwrap();
        for _ in 0..3 {
            let mut termios = std::mem::MaybeUninit::<libc::termios>::uninit();
            // SAFETY: TCGETS writes one termios into the buffer given, which is large enough.
            let rc = unsafe { libc::ioctl(f.as_raw_fd(), libc::TCGETS, termios.as_mut_ptr()) };
            let errno = std::io::Error::last_os_error().raw_os_error();
            assert_eq!((rc, errno), (-1, Some(libc::ENOTTY)), "{name}: TCGETS");
        }
    }
    // What Python itself does on open(), when Python is there.
    let script = concat!(
        "import sys\n",
        "for p in sys.argv[1:]:\n",
        "    with open(p, 'rb') as f: f.read(4)\n",
        "    with open(p, 'r', errors='replace') as f: f.read(4)\n",
    );
    match std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(m.file("w"))
        .arg(m.file("metadata.json"))
        .output()
    {
        Ok(out) => assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr)),
        Err(_) => println!("python3 not found: checked with ioctl(2) only"),
    }
    assert_eq!(std::fs::read(m.file("w")).unwrap(), tensors[0].data);
    let text = std::fs::read_to_string(&log).unwrap();
    for word in ["ioctl", "Not Implemented", "WARN"] {
        assert!(!text.contains(word), "the log mentions {word:?}: {text}");
    }
}
