#!/usr/bin/env bash
# Shell pipelines over an stfs mount: every tensor is a plain file of raw little-endian bytes, so dd,
# od and cmp work on it with no special tooling.
#
#   usage: examples/shell.sh MOUNTPOINT [CHECKPOINT]
#
# With CHECKPOINT (the file that is mounted), every tensor file is also compared with its bytes in
# the checkpoint, at the offset `stfs inspect` reports. STFS names the binary (default: stfs).
set -euo pipefail
set -f  # the table below is split into words; shapes like [32] must not glob

if [ $# -lt 1 ]; then
  echo "usage: $0 MOUNTPOINT [CHECKPOINT]" >&2
  exit 2
fi
mp=$1
checkpoint=${2:-}
stfs=${STFS:-stfs}
tensor=${TENSOR:-lm_head.weight}
file="$mp/$tensor"

size=$(stat -c %s "$file")
echo "$tensor: $size bytes"

# od: the first four float32 values, decoded from the raw bytes.
echo "first4: $(od -A n -t f4 -N 16 -v "$file" | xargs)"

# dd: a slice by block offsets (bytes 2048..4095); cmp -i skips to the same place in the whole file.
slice=$(mktemp)
trap 'rm -f "$slice"' EXIT
dd if="$file" of="$slice" bs=1024 skip=2 count=2 status=none
cmp -n 2048 -i 2048:0 "$file" "$slice"
echo "dd slice: ok"

# cmp: each tensor file is exactly the bytes at its absolute offset in the checkpoint. The table of
# `stfs inspect` ends each row with BYTES and OFFSET; the name is the first column.
if [ -n "$checkpoint" ]; then
  if ! command -v "$stfs" >/dev/null; then
    echo "$0: \`$stfs\` not found: install stfs (cargo install --path .) or set STFS=/path/to/stfs" >&2
    exit 1
  fi
  # Run inspect on its own first: a failure inside the loop's input would go unnoticed.
  table=$("$stfs" inspect "$checkpoint")
  checked=0
  while read -r name rest; do
    set -- $rest
    bytes=${*: -2:1}
    offset=${*: -1}
    [ "$(stat -c %s "$mp/$name")" -eq "$bytes" ]
    cmp -n "$bytes" -i "$offset:0" "$checkpoint" "$mp/$name"
    checked=$((checked + 1))
  done < <(printf '%s\n' "$table" | sed -e 1d -e '$d')
  if [ "$checked" -eq 0 ]; then
    echo "$0: \`$stfs inspect\` listed no tensors in $checkpoint" >&2
    exit 1
  fi
  echo "cmp against checkpoint: $checked tensors ok"
fi
