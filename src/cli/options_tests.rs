//! Tests of the mount options: `-o` parsing, the last value winning, defaults per source kind,
//! and each bad option named in its error.

use crate::cli::options::*;

fn args(options: &[&str]) -> MountArgs {
    MountArgs {
        source: "m.safetensors".into(),
        options: options.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

#[test]
fn defaults() {
    let c = MountConfig::from_args(args(&[])).unwrap();
    assert_eq!((c.engine.block_size, c.engine.cache_size), (DEFAULT_BLOCK_SIZE, DEFAULT_CACHE_SIZE));
    assert_eq!((c.threads, c.kernel_readahead_kb, c.allow_other), (default_threads(&c.source), 1024, false));
    assert_eq!((c.max_request_kb, c.serve_options().max_request_bytes), (1024, 1 << 20));
    for url in ["http://host/m.safetensors", "https://host/repo/model.safetensors.index.json"] {
        let c = MountConfig::from_args(MountArgs { source: url.into(), ..args(&[]) }).unwrap();
        assert_eq!(c.engine.block_size, DEFAULT_REMOTE_BLOCK_SIZE, "{url}");
        // extract and cat read through the same engine settings as a mount with no options.
        let e = default_engine(url);
        assert_eq!(
            (e.block_size, e.cache_size, e.io_threads),
            (c.engine.block_size, c.engine.cache_size, c.engine.io_threads)
        );
    }
    let e = default_engine("m.safetensors");
    assert_eq!(
        (e.block_size, e.cache_size, e.io_threads),
        (DEFAULT_BLOCK_SIZE, DEFAULT_CACHE_SIZE, default_io_threads("m.safetensors") as usize)
    );
    let explicit = MountArgs { source: "https://host/m.safetensors".into(), ..args(&["block_size=64K"]) };
    assert_eq!(MountConfig::from_args(explicit).unwrap().engine.block_size, 64 << 10);
}

#[test]
fn dash_o_options_map_to_flags_and_flags_win() {
    let c = MountConfig::from_args(args(&["ro,cache_size=1G,block-size=4M", "allow_other,nosuid,x-systemd.automount"]))
        .unwrap();
    assert_eq!((c.engine.cache_size, c.engine.block_size, c.allow_other), (1 << 30, 4 << 20, true));
    let c = MountConfig::from_args(args(&["npy,as=f32,layout=tree"])).unwrap();
    assert_eq!((c.views, c.layout), (Views { npy: true, as_f32: true }, Layout::Tree));
    assert!(c.checkpoint_files && c.fs_options().checkpoint_files);
    assert_eq!((c.cache_dir, c.cache_dir_size), (None, None));
    let c = MountConfig::from_args(args(&["cache_dir=/var/cache/stfs,cache-dir-size=2G"])).unwrap();
    assert_eq!((c.cache_dir, c.cache_dir_size), (Some(PathBuf::from("/var/cache/stfs")), Some(2 << 30)));
    for hide in ["no_checkpoint_file", "no-checkpoint-file=yes", "checkpoint_file=no"] {
        assert!(!MountConfig::from_args(args(&[hide])).unwrap().checkpoint_files, "{hide}");
    }
    let c = MountConfig::from_args(args(&["endpoint_url=http://h:9000,region=eu-west-1,no_sign_request"])).unwrap();
    let object = c.remote.open_options(Default::default()).unwrap().object;
    assert_eq!(object.endpoint_url.as_deref(), Some("http://h:9000"));
    assert_eq!((object.region.as_deref(), object.no_sign_request), (Some("eu-west-1"), true));
    assert_eq!(default_block_size("s3://b/k"), DEFAULT_REMOTE_BLOCK_SIZE);
    assert_eq!(default_block_size("gs://b/k"), DEFAULT_REMOTE_BLOCK_SIZE);
    let c = MountConfig::from_args(args(&["max_request_kb=16384"])).unwrap();
    assert_eq!(c.serve_options().max_request_bytes, 16 << 20);
    for bad in ["max_request_kb=2", "max_request_kb=16385", "max_request_kb=1M"] {
        let e = MountConfig::from_args(args(&[bad])).unwrap_err().to_string();
        assert!(e.contains("max_request_kb"), "{bad}: {e}");
    }
    let mut a = args(&["max_request_kb=4096"]);
    a.max_request_kb = Some(64);
    assert_eq!(MountConfig::from_args(a).unwrap().max_request_kb, 64);
    let mut a = args(&["cache_size=1G"]);
    a.cache_size = Some(64 << 20);
    assert_eq!(MountConfig::from_args(a).unwrap().engine.cache_size, 64 << 20);
}

#[test]
fn the_last_of_a_repeated_option_wins_and_misspellings_get_a_suggestion() {
    let c = MountConfig::from_args(args(&["cache_size=1G,cache_size=64M", "layout=tree", "layout=flat"])).unwrap();
    assert_eq!((c.engine.cache_size, c.layout), (64 << 20, Layout::Flat));
    let c = MountConfig::from_args(args(&["allow_other", "allow_other=0", "timeout=5s", "timeout=1.5s"]));
    assert!(c.is_err(), "a fractional duration is refused");
    let c = MountConfig::from_args(args(&["allow_other", "allow_other=0", "timeout=5s", "timeout=7s"])).unwrap();
    assert_eq!((c.allow_other, c.remote.timeout), (false, Some(std::time::Duration::from_secs(7))));
    let c = MountConfig::from_args(args(&["region=us-east-1,endpoint-url=http://a", "region=eu-west-1"])).unwrap();
    assert_eq!((c.remote.region.as_deref(), c.remote.endpoint_url.as_deref()), (Some("eu-west-1"), Some("http://a")));
    let e = MountConfig::from_args(args(&["no_sign_requests"])).unwrap_err().to_string();
    assert!(e.contains("did you mean `no_sign_request`?"), "{e}");
    let e = MountConfig::from_args(args(&["cache_sise=1G"])).unwrap_err().to_string();
    assert_eq!(e, "unknown mount option `cache_sise`; did you mean `cache_size`? (see `stfs mount --help`)");
}

#[test]
fn ownership_masks_and_conventions() {
    let c = MountConfig::from_args(args(&["uid=1000,gid=100,umask=022,allow_root,debug,read_only"])).unwrap();
    assert_eq!((c.owner.uid, c.owner.gid), (1000, 100));
    assert_eq!(c.perms, (Some(0o444), Some(0o555)));
    assert!(c.allow_root && c.debug && c.foreground);
    assert!(c.serve_options().allow_root);
    assert_eq!(c.fs_options().owner, Owner { uid: 1000, gid: 100 });
    // fmask and dmask win over umask for their kind.
    let c = MountConfig::from_args(args(&["umask=027,fmask=077"])).unwrap();
    assert_eq!(c.perms, (Some(0o400), Some(0o550)));
    let c = MountConfig::from_args(args(&[])).unwrap();
    assert_eq!((c.perms, c.owner, c.allow_root, c.debug), ((None, None), Owner::of_process(), false, false));
    for bad in ["umask=9", "fmask=1000", "dmask=", "uid=x", "gid=-1"] {
        assert!(MountConfig::from_args(args(&[bad])).is_err(), "{bad}");
    }
    let mut a = args(&[]);
    (a.debug, a.read_only) = (true, true);
    assert!(MountConfig::from_args(a).unwrap().foreground);
    // auto_unmount is off unless asked for, by -o or by --auto-unmount.
    assert!(!MountConfig::from_args(args(&[])).unwrap().auto_unmount);
    assert!(MountConfig::from_args(args(&["auto_unmount"])).unwrap().auto_unmount);
    assert!(!MountConfig::from_args(args(&["auto_unmount,auto_unmount=0"])).unwrap().auto_unmount);
    let mut a = args(&[]);
    a.auto_unmount = true;
    assert!(MountConfig::from_args(a).unwrap().auto_unmount);
}

#[test]
fn bad_options_name_the_option() {
    for (opts, needle) in [
        (&["bogus=1"][..], "unknown mount option `bogus`"),
        (&["rw"][..], "read-only"),
        (&["cache_size"][..], "needs a value"),
        (&["cache_size=lots"][..], "invalid size"),
        (&["block_size=3M"][..], "power of two"),
        (&["block_size=8M,cache_size=8M"][..], "at least two blocks"),
        (&["threads=0"][..], "whole number"),
        (&["allow_other=maybe"][..], "takes no value"),
        (&["as=f16"][..], "only `f32`"),
        (&["layout=deep"][..], "unknown layout"),
        (&["timeout=0s"][..], "invalid duration"),
    ] {
        let e = MountConfig::from_args(args(opts)).unwrap_err().to_string();
        assert!(e.contains(needle), "{opts:?}: {e}");
    }
}

#[test]
fn hidden_http_knobs_reach_the_options() {
    use std::time::Duration;
    let remote = RemoteArgs {
        http_retries: Some(2),
        http_retry_delay: Some(Duration::from_millis(10)),
        http_timeout: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    let http = remote.open_options(Default::default()).unwrap().http;
    assert_eq!(
        (http.retry.attempts, http.retry.base_delay, http.retry.max_delay),
        (2, Duration::from_millis(10), Duration::from_millis(320))
    );
    assert_eq!((http.connect_timeout, http.read_timeout), (Duration::from_secs(1), Duration::from_secs(1)));
    let bad = RemoteArgs { headers: vec!["no colon".into()], ..Default::default() };
    let e = bad.open_options(Default::default()).unwrap_err();
    assert!(e.to_string().starts_with("--header: "), "{e}");
    assert!(std::error::Error::source(&e).is_some());
}

#[test]
fn splicing_is_on_by_default_and_no_splice_turns_it_off() {
    assert!(MountConfig::from_args(args(&[])).unwrap().serve_options().splice);
    assert!(!MountConfig::from_args(args(&["no_splice"])).unwrap().serve_options().splice);
    let flag = MountArgs { no_splice: true, ..args(&[]) };
    assert!(!MountConfig::from_args(flag).unwrap().serve_options().splice);
}

#[test]
fn metrics_options_map_to_flags_and_flags_win() {
    let c = MountConfig::from_args(args(&[])).unwrap();
    assert!(c.metrics.metrics_file.is_none() && c.metrics.metrics_addr.is_none());
    let c = MountConfig::from_args(args(&["metrics_file=/t/stfs.prom,metrics-addr=[::1]:9400"])).unwrap();
    assert_eq!(c.metrics.metrics_file.as_deref(), Some(std::path::Path::new("/t/stfs.prom")));
    assert_eq!(c.metrics.metrics_addr, Some("[::1]:9400".parse().unwrap()));
    let mut a = args(&["metrics_file=/t/o.prom,metrics_addr=127.0.0.1:1"]);
    a.metrics.metrics_file = Some("/t/flag.prom".into());
    a.metrics.metrics_addr = Some("127.0.0.1:2".parse().unwrap());
    let c = MountConfig::from_args(a).unwrap();
    assert_eq!(c.metrics.metrics_file.as_deref(), Some(std::path::Path::new("/t/flag.prom")));
    assert_eq!(c.metrics.metrics_addr, Some("127.0.0.1:2".parse().unwrap()));
    let e = MountConfig::from_args(args(&["metrics_addr=localhost"])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "mount option `metrics_addr` needs an address and port such as 127.0.0.1:9400, got `localhost`"
    );
    assert!(MountConfig::from_args(args(&["metrics_file"])).is_err());
}

/// A header value may hold commas, written `\,`; an unknown option after a `header=` one may be the
/// rest of a value cut at a comma, so the error does not show it.
#[test]
fn a_header_value_keeps_escaped_commas_and_its_tail_is_never_echoed() {
    let c = MountConfig::from_args(args(&[r"header=X-Token: part1\,part2,npy"])).unwrap();
    assert_eq!(c.remote.headers, ["X-Token: part1,part2"]);
    assert!(c.views.npy);
    for opts in [&[r"header=X-K:abc,SECRETTAIL12"][..], &["header=X-K:abc", "cache_size=1G,SECRETTAIL12=x"]] {
        let e = MountConfig::from_args(args(opts)).unwrap_err().to_string();
        assert_eq!(e, r"unknown mount option after header= (write a comma inside a header value as \,)", "{opts:?}");
    }
}
