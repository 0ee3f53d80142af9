#!/usr/bin/env bash
# verify_local.sh -- CPU-side check of the bundle in .gpu/pieces/.
# Checks every piece's sha256 and the sha256 of the concatenated archive against
# SHA256SUMS, unpacks into a temporary dir, checks that the expected top-level
# packages are there, that the vLLM version is 0.26.0, that nothing from the
# image (torch, numpy, numba, triton, transformers, nvidia cu13 runtime libs...) slipped in,
# and that every distribution listed in MANIFEST.txt has its .dist-info.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
P="$HERE/pieces"
die() { echo "verify_local: FAIL: $*" >&2; exit 1; }
t0=$(date +%s)
[ -f "$P/SHA256SUMS" ] || die "no $P/SHA256SUMS"

mapfile -t PIECES < <(awk '$2 ~ /^site\.tar\.xz\.p[0-9][0-9]$/ {print $2}' "$P/SHA256SUMS" | sort)
[ "${#PIECES[@]}" -gt 0 ] || die "SHA256SUMS lists no pieces"
# Per-piece limit = the piece size the bundle was split with: $PIECE_MIB if set, else the "# Piece size: N MiB"
# line of pieces/MANIFEST.txt (build_pieces.sh writes it), else 48 MiB; never above 64 MiB (a device call carries
# at most 64 MiB in all, working tree included).
MAX_MIB=64
if [ -z "${PIECE_MIB:-}" ] && [ -f "$P/MANIFEST.txt" ]; then
  PIECE_MIB=$(sed -n 's/^# Piece size: \([0-9][0-9]*\) MiB.*/\1/p' "$P/MANIFEST.txt" | head -1)
fi
PIECE_MIB=${PIECE_MIB:-48}
[[ "$PIECE_MIB" =~ ^[0-9]+$ ]] && [ "$PIECE_MIB" -ge 1 ] && [ "$PIECE_MIB" -le "$MAX_MIB" ] \
  || die "piece size '$PIECE_MIB' MiB is not an integer in 1..$MAX_MIB"
LIMIT=$((PIECE_MIB*1024*1024))
last=$(( ${#PIECES[@]} - 1 ))
for i in "${!PIECES[@]}"; do
  p=${PIECES[$i]}
  [ -f "$P/$p" ] || die "missing piece $p"
  s=$(stat -c %s "$P/$p"); [ "$s" -le "$LIMIT" ] || die "$p is $s bytes > $PIECE_MIB MiB"
  # split -b gives equal full-size pieces and a last one no larger than them
  [ "$i" -gt 0 ] || first=$s
  if [ "$i" -lt "$last" ]; then [ "$s" -eq "$first" ] || die "$p is $s bytes, ${PIECES[0]} is $first: not one split -b run"
  else [ "$s" -le "$first" ] || die "last piece $p ($s B) is larger than ${PIECES[0]} ($first B)"; fi
done
echo "verify_local: ${#PIECES[@]} pieces, each <= $PIECE_MIB MiB"
( cd "$P" && awk '$2 ~ /^site\.tar\.xz\.p[0-9][0-9]$/' SHA256SUMS | sha256sum -c --strict ) || die "piece checksum mismatch"
want=$(awk '$2 == "site.tar.xz" {print $1}' "$P/SHA256SUMS")
got=$(cd "$P" && cat "${PIECES[@]}" | sha256sum | cut -d' ' -f1)
[ "$want" = "$got" ] || die "whole-archive sha256 mismatch: want $want got $got"
echo "verify_local: whole archive site.tar.xz: OK ($got)"

TMP=$(mktemp -d /tmp/verify_site.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
( cd "$P" && cat "${PIECES[@]}" ) | xz -dc | tar -x -C "$TMP" || die "unpack failed"
echo "verify_local: unpacked: $(du -sb "$TMP" | cut -f1) bytes ($(du -sh "$TMP" | cut -f1)), $(find "$TMP" -type f | wc -l) files, $(ls -d "$TMP"/*.dist-info | wc -l) dist-info dirs"

fail=0
for m in vllm lm_eval flashinfer msgspec pydantic pydantic_core zmq junitparser fastapi starlette openai anthropic \
         xgrammar llguidance outlines_core lmformatenforcer mistral_common compressed_tensors depyf partial_json_parser \
         openai_harmony mcp opentelemetry tvm_ffi cudnn fastsafetensors blake3 cachetools cbor2 datasets evaluate \
         rouge_score pytablewriter word2number more_itertools dill multiprocess uvicorn humming quack cuda/tile; do
  if [ -f "$TMP/$m/__init__.py" ] || [ -d "$TMP/$m" ]; then :; else echo "verify_local: MISSING top-level package $m"; fail=1; fi
done
[ -f "$TMP/sqlitedict.py" ] || { echo "verify_local: MISSING sqlitedict.py"; fail=1; }
for m in torch numpy numba triton transformers tokenizers safetensors huggingface_hub; do
  [ -e "$TMP/$m" ] && { echo "verify_local: UNEXPECTED image package in bundle: $m"; fail=1; }
done
for d in "$TMP"/nvidia/cu13/lib "$TMP"/nvidia/cublas "$TMP"/tokenspeed_triton "$TMP"/tilelang "$TMP"/torchcodec "$TMP"/z3; do
  [ -e "$d" ] && { echo "verify_local: UNEXPECTED excluded content in bundle: ${d#$TMP/}"; fail=1; }
done
for ns in nvidia cuda google; do
  [ -f "$TMP/$ns/__init__.py" ] && { echo "verify_local: $ns/__init__.py would shadow the image's $ns namespace"; fail=1; }
done

v=$(sed -n "s/^__version__ = version = '\(.*\)'$/\1/p" "$TMP/vllm/_version.py")
grep -q "from .version import __version__" "$TMP/vllm/__init__.py" || { echo "verify_local: vllm/__init__.py does not import __version__ from .version"; fail=1; }
grep -q "^Version: 0.26.0$" "$TMP"/vllm-0.26.0.dist-info/METADATA || { echo "verify_local: vllm dist-info is not 0.26.0"; fail=1; }
[ "$v" = "0.26.0" ] && echo "verify_local: vllm/__init__.py -> .version -> _version.py says __version__ = '$v'" || { echo "verify_local: vllm _version.py says '$v'"; fail=1; }
fi_v=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$TMP/flashinfer/_build_meta.py" 2>/dev/null | head -1)
echo "verify_local: flashinfer/_build_meta.py __version__ = '${fi_v}'"; [ "$fi_v" = "0.6.14" ] || fail=1
grep -q "^Version: 0.4.13$" "$TMP"/lm_eval-0.4.13.dist-info/METADATA && echo "verify_local: lm_eval dist-info 0.4.13" || { echo "verify_local: lm_eval is not 0.4.13"; fail=1; }

# every distribution in MANIFEST.txt has a dist-info, and no extra ones
if [ -f "$P/MANIFEST.txt" ]; then
  python3 - "$TMP" "$P/MANIFEST.txt" <<'EOF' || fail=1
import sys, os, re
tmp, man = sys.argv[1:]
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
listed = {}
sect = None
for line in open(man):
    if line.startswith("## "): sect = line.strip()
    m = re.match(r"^\s+([A-Za-z0-9_.\-]+)==(\S+)\s*$", line)
    if m and sect and sect.startswith("## Bundled"): listed[norm(m.group(1))] = m.group(2)
have = {}
for d in os.listdir(tmp):
    if d.endswith(".dist-info"):
        meta = open(os.path.join(tmp, d, "METADATA"), encoding="utf-8").read()
        n = re.search(r"^Name: (.+)$", meta, re.M).group(1).strip(); v = re.search(r"^Version: (.+)$", meta, re.M).group(1).strip()
        have[norm(n)] = v
bad = [f"{n}: manifest {listed.get(n)} vs bundle {have.get(n)}" for n in sorted(set(listed) | set(have)) if listed.get(n) != have.get(n)]
print(f"verify_local: MANIFEST lists {len(listed)} distributions; bundle has {len(have)} dist-info; mismatches: {len(bad)}")
for b in bad: print("verify_local:   ", b)
sys.exit(1 if bad or not listed else 0)
EOF
fi
[ "$fail" -eq 0 ] || die "content checks failed (see above)"
echo "verify_local: OK ($(( $(date +%s) - t0 )) s)"
