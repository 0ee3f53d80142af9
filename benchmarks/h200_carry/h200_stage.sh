#!/usr/bin/env bash
# h200_stage.sh -- run on the H200 machine in each EARLIER carry call.
# Copies the piece(s) this call carried (.gpu/pieces/site.tar.xz.pNN, plus SHA256SUMS
# if carried) into $PIECES_DIR (default /tmp/pieces, which survives between calls
# while the machine stays warm) and checks each copied piece against SHA256SUMS.
# Example device command (carry: [".gpu/pieces/site.tar.xz.p00", ".gpu/pieces/SHA256SUMS", ".gpu/h200_stage.sh"]):
#   bash .gpu/h200_stage.sh
set -euo pipefail
PIECES_DIR=${PIECES_DIR:-/tmp/pieces}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { echo "h200_stage: ERROR: $*" >&2; exit 1; }
mkdir -p "$PIECES_DIR"
[ -f "$HERE/pieces/SHA256SUMS" ] && cp -f "$HERE/pieces/SHA256SUMS" "$PIECES_DIR/SHA256SUMS"
SUMS="$PIECES_DIR/SHA256SUMS"
n=0
for f in "$HERE"/pieces/site.tar.xz.p[0-9][0-9]; do
  [ -f "$f" ] || continue
  b=$(basename "$f")
  cp -f "$f" "$PIECES_DIR/$b"
  if [ -f "$SUMS" ]; then
    want=$(awk -v n="$b" '$2 == n {print $1}' "$SUMS")
    got=$(sha256sum "$PIECES_DIR/$b" | cut -d' ' -f1)
    [ -n "$want" ] || die "$b is not listed in SHA256SUMS"
    [ "$want" = "$got" ] || die "sha256 mismatch for $b: expected $want, got $got"
    echo "h200_stage: ok   $b  $got"
  else
    echo "h200_stage: copied $b (no SHA256SUMS carried, not checked)"
  fi
  n=$((n+1))
done
[ "$n" -gt 0 ] || die "no piece found under $HERE/pieces (did carry name .gpu/pieces/site.tar.xz.pNN?)"
echo "h200_stage: $PIECES_DIR now holds: $(cd "$PIECES_DIR" && ls site.tar.xz.p* | tr '\n' ' ')"
df -h /tmp | tail -1
