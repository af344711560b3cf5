"""The command-line options shared by the benches that read a checkpoint through the latency proxy
(remote.py, s3.py, kubernetes.py): the stfs binary, the checkpoint's and its tensors' sizes, the proxy's
latency and per-connection rate, the repetitions, and --quick."""
import cargo_paths  # scripts/bench/, this file's folder

# --conn-mib-s as the S3 and Kubernetes benches take it: each connection paced to 100 MiB/s.
PACED = (100.0, "pace each connection to this rate [100]")


def add_remote_options(parser, reps, quick, conn_mib_s=PACED):
    """Adds the shared options to `parser`: `reps` repetitions by default, `quick` the help of --quick
    (what the smoke run does), `conn_mib_s` the default and help of --conn-mib-s."""
    parser.add_argument("--stfs", default=cargo_paths.binary("stfs"), help="the stfs binary")
    parser.add_argument("--size-mb", type=int, default=1024, help="checkpoint size in MiB [1024]")
    parser.add_argument("--tensor-mb", type=int, default=16, help="approximate size of each tensor in MiB [16]")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="latency the proxy adds per request [20]")
    default, help_text = conn_mib_s
    parser.add_argument("--conn-mib-s", type=float, default=default, help=help_text)
    parser.add_argument("--reps", type=int, default=reps, help=f"repetitions of each measurement [{reps}]")
    parser.add_argument("--quick", action="store_true", help=quick)
