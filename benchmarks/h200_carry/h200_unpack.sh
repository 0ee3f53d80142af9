#!/usr/bin/env bash
# h200_unpack.sh -- run on the lent H200 machine in the LAST carry call.
#
# Expects the bundle pieces site.tar.xz.pNN in $PIECES_DIR (default /tmp/pieces;
# earlier calls staged them there with h200_stage.sh), plus SHA256SUMS either in
# $PIECES_DIR or next to this script in pieces/.  Any piece that this call carried
# (under <this script's dir>/pieces/) is copied into $PIECES_DIR first.
#
# Then: verify every piece's sha256, verify the sha256 of the concatenated archive,
# unpack into $SITE (default /tmp/site), and smoke-test with the image's python3:
#   PYTHONPATH=/tmp/site python3 -c "import torch, vllm, lm_eval, flashinfer; ..."
# Exits non-zero with a clear message on any mismatch or failure.
#
# Afterwards, in the same call (or later calls while the machine stays warm):
#   export PYTHONPATH=/tmp/site
# Do NOT add /tmp/site/nvidia_cutlass_dsl/dsl_packages to PYTHONPATH: the CuTe-DSL
# runtime libraries (nvidia-cutlass-dsl-libs-cu13) are deliberately not in the bundle,
# and making `cutlass` importable without them would break flashinfer's fallback.
set -euo pipefail

PIECES_DIR=${PIECES_DIR:-/tmp/pieces}
SITE=${SITE:-/tmp/site}
PY=${PY:-python3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
EXPECT_VLLM=0.26.0
EXPECT_LMEVAL=0.4.13
EXPECT_FLASHINFER=0.6.14
EXPECT_TORCH_PREFIX=2.11.0

die() { echo "h200_unpack: ERROR: $*" >&2; exit 1; }
t0=$(date +%s)

mkdir -p "$PIECES_DIR"
# 0. bring in whatever this call carried
for f in "$HERE"/pieces/site.tar.xz.p[0-9][0-9] "$HERE"/pieces/SHA256SUMS "$HERE"/pieces/MANIFEST.txt; do
  [ -f "$f" ] || continue
  b=$(basename "$f")
  if [ ! -f "$PIECES_DIR/$b" ] || ! cmp -s "$f" "$PIECES_DIR/$b"; then
    cp -f "$f" "$PIECES_DIR/$b"
  fi
done

SUMS="$PIECES_DIR/SHA256SUMS"
[ -f "$SUMS" ] || die "SHA256SUMS not found in $PIECES_DIR nor in $HERE/pieces (carry .gpu/pieces/SHA256SUMS)"

# 1. every piece listed must be present with the right sha256
mapfile -t PIECES < <(awk '$2 ~ /^site\.tar\.xz\.p[0-9][0-9]$/ {print $2}' "$SUMS" | sort)
[ "${#PIECES[@]}" -gt 0 ] || die "SHA256SUMS lists no pieces"
WHOLE_SUM=$(awk '$2 == "site.tar.xz" {print $1}' "$SUMS")
[ -n "$WHOLE_SUM" ] || die "SHA256SUMS has no line for the whole archive site.tar.xz"
missing=()
for p in "${PIECES[@]}"; do [ -f "$PIECES_DIR/$p" ] || missing+=("$p"); done
[ "${#missing[@]}" -eq 0 ] || die "missing pieces in $PIECES_DIR: ${missing[*]} (present: $(cd "$PIECES_DIR" && ls site.tar.xz.p* 2>/dev/null | tr '\n' ' '))"
for p in "${PIECES[@]}"; do
  want=$(awk -v n="$p" '$2 == n {print $1}' "$SUMS")
  got=$(sha256sum "$PIECES_DIR/$p" | cut -d' ' -f1)
  [ "$want" = "$got" ] || die "sha256 mismatch for $p: expected $want, got $got (size $(stat -c %s "$PIECES_DIR/$p"))"
  echo "h200_unpack: ok   $p  $got"
done
extra=$(cd "$PIECES_DIR" && ls site.tar.xz.p* 2>/dev/null | grep -vxF -f <(printf '%s\n' "${PIECES[@]}") || true)
[ -z "$extra" ] || echo "h200_unpack: note: ignoring unlisted files in $PIECES_DIR: $extra"

# 2. whole-archive checksum
got=$(cd "$PIECES_DIR" && cat "${PIECES[@]}" | sha256sum | cut -d' ' -f1)
[ "$got" = "$WHOLE_SUM" ] || die "sha256 mismatch for concatenated site.tar.xz: expected $WHOLE_SUM, got $got"
echo "h200_unpack: ok   site.tar.xz (concatenation of ${#PIECES[@]} pieces)  $got"

# 3. unpack
rm -rf "$SITE"; mkdir -p "$SITE"
( cd "$PIECES_DIR" && cat "${PIECES[@]}" ) | xz -dc -T0 | tar -x -C "$SITE" || die "unpacking failed"
[ -f "$SITE/vllm/__init__.py" ] || die "unpacked tree has no vllm/__init__.py"
echo "h200_unpack: unpacked into $SITE: $(du -sh "$SITE" | cut -f1), $(find "$SITE" -type f | wc -l) files, $(( $(date +%s) - t0 )) s so far"

# 4. smoke test with the image's python3
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
out=$("$PY" -c "import torch, vllm, lm_eval, flashinfer; print(vllm.__version__, torch.__version__, flashinfer.__version__)" 2>&1) \
  || { echo "$out" >&2; die "smoke import failed (see traceback above)"; }
echo "$out"
read -r v_vllm v_torch v_fi <<<"$(echo "$out" | tail -n 1)"
[ "$v_vllm" = "$EXPECT_VLLM" ] || die "vllm version is '$v_vllm', expected $EXPECT_VLLM"
[ "$v_fi" = "$EXPECT_FLASHINFER" ] || die "flashinfer version is '$v_fi', expected $EXPECT_FLASHINFER"
case "$v_torch" in "$EXPECT_TORCH_PREFIX"*) ;; *) die "torch is '$v_torch', expected $EXPECT_TORCH_PREFIX* from the image";; esac

# 5. where things come from + requirement consistency (warnings only)
"$PY" - "$SITE" "$EXPECT_LMEVAL" <<'PYEOF' || die "post-import checks failed"
import sys, importlib, importlib.metadata as md, re
site, want_lmeval = sys.argv[1], sys.argv[2]
import torch, vllm, lm_eval, flashinfer, numpy, transformers
bad = []
for m in (vllm, lm_eval, flashinfer):
    if not m.__file__.startswith(site):
        bad.append(f"{m.__name__} imported from {m.__file__}, not from {site}")
for m in (torch, numpy, transformers):
    if m.__file__.startswith(site):
        bad.append(f"{m.__name__} imported from the bundle ({m.__file__}); it must come from the image")
lv = md.version("lm_eval")
if lv != want_lmeval:
    bad.append(f"lm_eval version {lv}, expected {want_lmeval}")
print(f"h200_unpack: torch {torch.__version__} (cuda {torch.version.cuda}, available={torch.cuda.is_available()}), "
      f"numpy {numpy.__version__}, transformers {transformers.__version__}, lm_eval {lv}")
# extra imports that the engine / lm-eval need; failures here are errors
for name in ["vllm._C_stable_libtorch", "vllm.entrypoints.llm", "vllm.v1.engine.core", "lm_eval.evaluator", "lm_eval.models.vllm_causallms",
             "msgspec", "zmq", "pydantic", "fastapi", "openai", "xgrammar", "llguidance", "outlines_core",
             "blake3", "cbor2", "datasets", "evaluate", "junitparser", "sqlitedict"]:
    try:
        importlib.import_module(name)
    except Exception as e:
        bad.append(f"import {name} failed: {type(e).__name__}: {e}")
# requirement consistency of bundled distributions against the combined environment
try:
    from packaging.requirements import Requirement
    from packaging.version import Version
except Exception as e:
    print("h200_unpack: (packaging not importable, skipping requirement check)", e); Requirement = None
if Requirement:
    norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
    expected = {"numba", "torchcodec", "pynvvideocodec", "tilelang", "tokenspeed-triton", "nvidia-cutlass-dsl-libs-cu12",
                "nvidia-cutlass-dsl-libs-cu13", "nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "z3-solver",
                "setuptools", "cuda-bindings"}
    seen = set(); warn = []
    for d in md.distributions(path=[site]):
        name = norm(d.metadata["Name"])
        if name in seen: continue
        seen.add(name)
        for r in d.requires or []:
            q = Requirement(r)
            if q.marker and not q.marker.evaluate({"extra": ""}):
                continue
            try:
                have = md.version(q.name)
            except md.PackageNotFoundError:
                warn.append(("MISSING", name, str(q), "-"))
                continue
            if q.specifier and not q.specifier.contains(Version(have), prereleases=True):
                warn.append(("CONFLICT", name, str(q), have))
    for kind, who, req, have in sorted(warn, key=lambda w: (norm(Requirement(w[2]).name) not in expected, w)):
        tag = "expected" if norm(Requirement(req).name) in expected else "CHECK"
        print(f"h200_unpack: req {kind:8s} [{tag}] {who} needs {req}; found {have}")
    print(f"h200_unpack: requirement check: {len(seen)} bundled distributions, {len(warn)} unmet requirements "
          f"({sum(1 for w in warn if norm(Requirement(w[2]).name) not in expected)} not on the expected list)")
if bad:
    for b in bad: print("h200_unpack: ERROR:", b, file=sys.stderr)
    sys.exit(1)
PYEOF

echo "h200_unpack: OK -- vllm $v_vllm, torch $v_torch, flashinfer $v_fi, lm_eval $EXPECT_LMEVAL; $(( $(date +%s) - t0 )) s"
echo "h200_unpack: now use: export PYTHONPATH=$SITE"
