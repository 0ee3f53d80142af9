#!/usr/bin/env bash
# build_pieces.sh -- rebuild the vLLM 0.26.0 carry pieces for the lent H200 (see README.md here).
#
#   bash benchmarks/h200_carry/build_pieces.sh [PIECE_MIB]        # or PIECE_MIB=30 bash ...
#
# 1. downloads every wheel of dl_list.tsv (name, version, URL, sha256) into $CACHE (default /tmp/h200_wheels,
#    reused: a cached wheel whose sha256 matches is not fetched again) and checks each sha256;
#    file:///tmp/built/* entries (sqlitedict, word2number: no wheel on PyPI) are rebuilt from their PyPI sdist
#    (sdist sha256 pinned below) with SOURCE_DATE_EPOCH, if the original build is not at that path;
# 2. unzips the wheels of carry.txt (the bundled ones; excluded.tsv lists the rest) into ONE fresh site/ folder
#    (pip --target / --no-deps layout: plain unzip, *.data/purelib|platlib moved to the top, *.data/scripts dropped);
# 3. removes what verify_local.sh says must not be in the bundle (image packages, excluded content, namespace
#    __init__.py files that would shadow the image's nvidia/cuda/google namespaces);
# 4. tar (sorted, owner 0, mtime 0) | xz $XZ_OPTS (default -T2 -6) -> site.tar.xz, split -b ${PIECE_MIB}M -d -a 2
#    into $OUTDIR/pieces/site.tar.xz.pNN (default OUTDIR=<checkout>/.gpu), with SHA256SUMS (one line per piece
#    + one for the whole site.tar.xz) and MANIFEST.txt; copies h200_stage.sh, h200_unpack.sh, verify_local.sh
#    to $OUTDIR and makes sure /.gpu/ is in .git/info/exclude.
#
# Environment: PIECE_MIB (48; 1..64), CACHE (/tmp/h200_wheels), WORK (/tmp/h200_build: site/ and site.tar.xz),
#   OUTDIR (<checkout>/.gpu), XZ_OPTS ("-T2 -6"), DOWNLOAD_EXCLUDED (1: also fetch the excluded wheels, as the
#   original build did; 0: fetch only the bundled ones), REUSE_ARCHIVE (0; 1: skip steps 2-4's unpack/tar/xz when
#   $WORK/site.tar.xz from an earlier run is there, i.e. only re-split it -- e.g. for another piece size),
#   KEEP_SITE (0; 1: keep $WORK/site after the build).
set -euo pipefail
umask 022
export LC_ALL=C

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PIECE_MIB=${1:-${PIECE_MIB:-48}}
CACHE=${CACHE:-/tmp/h200_wheels}
WORK=${WORK:-/tmp/h200_build}
OUTDIR=${OUTDIR:-$REPO/.gpu}
XZ_OPTS=${XZ_OPTS:--T2 -6}
DOWNLOAD_EXCLUDED=${DOWNLOAD_EXCLUDED:-1}
REUSE_ARCHIVE=${REUSE_ARCHIVE:-0}
KEEP_SITE=${KEEP_SITE:-0}
SDE=315532800   # SOURCE_DATE_EPOCH (1980-01-01) for the sdist rebuilds: makes them byte-reproducible

DL="$HERE/dl_list.tsv"; CARRY="$HERE/carry.txt"; EXCL="$HERE/excluded.tsv"; OLD_MANIFEST="$HERE/MANIFEST.txt"

# sdists of the two wheels that were built locally (file:///tmp/built/...): name -> "url sha256"
declare -A SDIST=(
  [sqlitedict]="https://files.pythonhosted.org/packages/12/9a/7620d1e9dcb02839ed6d4b14064e609cdd7a8ae1e47289aa0456796dd9ca/sqlitedict-2.1.0.tar.gz 03d9cfb96d602996f1d4c2db2856f1224b96a9c431bdd16e78032a72940f9e8c"
  [word2number]="https://files.pythonhosted.org/packages/4a/29/a31940c848521f0725f0df6b25dca8917f13a2025b0e8fcbe5d0457e45e6/word2number-1.1.zip 70e27a5d387f67b04c71fbb7621c05930b19bfd26efd6851e6e0f9969dcde7d0"
)

log() { printf '%s build_pieces: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf 'build_pieces: ERROR: %s\n' "$*" >&2; exit 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }
arr_decl() { local n=$1; shift; printf '%s=(' "$n"; [ $# -eq 0 ] || printf '%q ' "$@"; printf ')\n'; }
T0=$(date +%s)
stage_t=$T0
stage_done() { local now; now=$(date +%s); log "$1 done in $((now - stage_t)) s (total $((now - T0)) s)"; stage_t=$now; }

[[ "$PIECE_MIB" =~ ^[0-9]+$ ]] && [ "$PIECE_MIB" -ge 1 ] && [ "$PIECE_MIB" -le 64 ] \
  || die "PIECE_MIB must be an integer 1..64 (a device call carries at most 64 MiB in all), got '$PIECE_MIB'"
for f in "$DL" "$CARRY" "$EXCL" "$OLD_MANIFEST" "$HERE/h200_stage.sh" "$HERE/h200_unpack.sh" "$HERE/verify_local.sh"; do
  [ -f "$f" ] || die "missing $f"
done
for t in curl unzip zipinfo tar xz split sha256sum python3 pip; do command -v "$t" >/dev/null || die "needs $t"; done
log "PIECE_MIB=$PIECE_MIB CACHE=$CACHE WORK=$WORK OUTDIR=$OUTDIR XZ_OPTS='$XZ_OPTS' DOWNLOAD_EXCLUDED=$DOWNLOAD_EXCLUDED REUSE_ARCHIVE=$REUSE_ARCHIVE"
mkdir -p "$CACHE" "$WORK"

# ---------------------------------------------------------------------------------------------------------------
# 1. download + sha256
declare -A URL_OF SHA_OF NAME_OF VER_OF
declare -a ALL_WHEELS
while IFS=$'\t' read -r name ver url want rest; do
  [ -n "$name" ] || continue
  [ -z "${rest:-}" ] || die "dl_list.tsv: more than 4 columns for $name"
  [[ "$want" =~ ^[0-9a-f]{64}$ ]] || die "dl_list.tsv: bad sha256 for $name"
  w=${url##*/}
  [[ "$w" == *.whl ]] || die "dl_list.tsv: $name: not a wheel URL: $url"
  URL_OF[$w]=$url; SHA_OF[$w]=$want; NAME_OF[$w]=$name; VER_OF[$w]=$ver; ALL_WHEELS+=("$w")
done < "$DL"
mapfile -t CARRY_WHEELS < <(awk -F'\t' 'NF {print $NF}' "$CARRY")   # carry.txt: name, version, wheel file
mapfile -t EXCL_NAMES < <(cut -f1 "$EXCL" | grep -v '^\s*$')
declare -A IS_CARRY IS_EXCL
for w in "${CARRY_WHEELS[@]}"; do
  [ -n "${URL_OF[$w]:-}" ] || die "carry.txt: $w is not in dl_list.tsv"
  line=$(awk -F'\t' -v w="$w" '$NF == w {print $1"\t"$2}' "$CARRY")
  [ "$line" = "${NAME_OF[$w]}"$'\t'"${VER_OF[$w]}" ] || die "carry.txt says '$line' for $w, dl_list.tsv '${NAME_OF[$w]} ${VER_OF[$w]}'"
  IS_CARRY[$w]=1
done
for n in "${EXCL_NAMES[@]}"; do IS_EXCL[$n]=1; done
for w in "${ALL_WHEELS[@]}"; do
  if [ -n "${IS_CARRY[$w]:-}" ] && [ -n "${IS_EXCL[${NAME_OF[$w]}]:-}" ]; then die "${NAME_OF[$w]} is both carried and excluded"; fi
  [ -n "${IS_CARRY[$w]:-}" ] || [ -n "${IS_EXCL[${NAME_OF[$w]}]:-}" ] || die "${NAME_OF[$w]} ($w) is neither in carry.txt nor in excluded.tsv"
done
log "dl_list.tsv: ${#ALL_WHEELS[@]} wheels; carry.txt: ${#CARRY_WHEELS[@]} bundled; excluded.tsv: ${#EXCL_NAMES[@]}"

declare -A REBUILT=()   # wheel -> new sha256 (sdist rebuilds whose sha256 cannot match the original local build)
rebuild_from_sdist() {  # $1 wheel file name, $2 dist name; leaves $CACHE/$1
  local w=$1 n=$2 spec url want tmp sd got
  spec=${SDIST[$n]:-}; [ -n "$spec" ] || die "$w: no local build at ${URL_OF[$w]#file://} and no sdist pinned for $n"
  url=${spec% *}; want=${spec#* }
  tmp=$(mktemp -d "$WORK/sdist.XXXXXX")
  sd="$tmp/${url##*/}"
  curl -fsSL --retry 5 --retry-delay 5 -o "$sd" "$url" || die "download of $url failed"
  got=$(sha "$sd"); [ "$got" = "$want" ] || die "sdist ${url##*/}: sha256 $got, expected $want"
  mkdir -p "$tmp/out"
  SOURCE_DATE_EPOCH=$SDE PIP_DISABLE_PIP_VERSION_CHECK=1 \
    pip wheel -q --no-deps --no-cache-dir -w "$tmp/out" "$sd" >"$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log" >&2; die "building $w from ${url##*/} failed"; }
  [ -f "$tmp/out/$w" ] || die "building ${url##*/} gave $(ls "$tmp/out"), expected $w"
  mv -f "$tmp/out/$w" "$CACHE/$w"
  sha "$CACHE/$w" > "$CACHE/$w.rebuilt.sha256"
  echo "$want  ${url##*/}" > "$CACHE/$w.sdist.sha256"
  rm -rf "$tmp"
}

fetched=0; cached=0
for w in "${ALL_WHEELS[@]}"; do
  if [ "$DOWNLOAD_EXCLUDED" != 1 ] && [ -z "${IS_CARRY[$w]:-}" ]; then continue; fi
  url=${URL_OF[$w]}; want=${SHA_OF[$w]}; dest="$CACHE/$w"
  if [ -f "$dest" ]; then
    got=$(sha "$dest")
    if [ "$got" = "$want" ]; then cached=$((cached+1)); continue; fi
    if [[ "$url" == file:///tmp/built/* ]] && [ -f "$dest.rebuilt.sha256" ] && [ "$got" = "$(cat "$dest.rebuilt.sha256")" ]; then
      REBUILT[$w]=$got; cached=$((cached+1)); continue
    fi
    log "cached $w has sha256 $got, expected $want: fetching again"; rm -f "$dest"
  fi
  case "$url" in
    https://files.pythonhosted.org/*)
      curl -fsSL --retry 5 --retry-delay 5 -o "$dest.part" "$url" || die "download of $url failed" ;;
    file:///tmp/built/*)
      src=${url#file://}
      if [ -f "$src" ] && [ "$(sha "$src")" = "$want" ]; then cp -f "$src" "$dest.part"
      else
        log "$w: the original local build ($src) is gone: rebuilding it from the PyPI sdist"
        rebuild_from_sdist "$w" "${NAME_OF[$w]}"
        REBUILT[$w]=$(cat "$dest.rebuilt.sha256"); fetched=$((fetched+1))
        log "$w rebuilt: sha256 ${REBUILT[$w]} (dl_list.tsv's $want was a non-reproducible local build)"
        continue
      fi ;;
    file:///*)
      src=${url#file://}; [ -f "$src" ] || die "$w: $src not found"; cp -f "$src" "$dest.part" ;;
    *) die "$w: unsupported URL $url (internet reaches PyPI only)" ;;
  esac
  got=$(sha "$dest.part")
  [ "$got" = "$want" ] || { rm -f "$dest.part"; die "$w: sha256 $got, expected $want"; }
  mv -f "$dest.part" "$dest"; fetched=$((fetched+1))
done
log "wheels: $fetched fetched, $cached reused from $CACHE, all sha256 OK"
stage_done "download"

# ---------------------------------------------------------------------------------------------------------------
# 2.-4. site/ -> site.tar.xz
SITE="$WORK/site"; ARCH="$WORK/site.tar.xz"
declare -a REMOVED=() DROPPED_DATA=() DUPS=()
if [ "$REUSE_ARCHIVE" = 1 ] && [ -f "$ARCH" ] && [ -f "$WORK/site.stats" ]; then
  log "REUSE_ARCHIVE=1: re-splitting the existing $ARCH ($(stat -c %s "$ARCH") B)"
  # shellcheck disable=SC1091
  . "$WORK/site.stats"
else
  rm -rf "$SITE" "$ARCH" "$WORK/site.stats"; mkdir -p "$SITE"
  : > "$WORK/files.all"
  for w in "${CARRY_WHEELS[@]}"; do
    whl="$CACHE/$w"
    zipinfo -1 "$whl" | grep -v '/$' | sort > "$WORK/files.one"
    while IFS= read -r d; do DUPS+=("$d (again from $w)"); done < <(comm -12 "$WORK/files.one" "$WORK/files.all")
    sort -m -o "$WORK/files.all" "$WORK/files.all" "$WORK/files.one"
    unzip -q -o "$whl" -d "$SITE" || die "unzip of $w failed"
    for dd in "$SITE"/*.data; do
      [ -d "$dd" ] || continue
      for sub in "$dd"/*; do
        case "${sub##*/}" in
          purelib|platlib) cp -a "$sub/." "$SITE/" ;;
          *) DROPPED_DATA+=("${dd##*/}/${sub##*/} ($(find "$sub" -type f | wc -l) files)") ;;
        esac
      done
      rm -rf "$dd"
    done
  done
  for d in "${DUPS[@]}"; do log "note: file in two wheels, last one kept: $d"; done
  for d in "${DROPPED_DATA[@]}"; do log "dropped (not importable, pip --target would put it in bin/ etc.): $d"; done
  # what verify_local.sh says must not be in the bundle
  for p in torch numpy numba triton transformers tokenizers safetensors huggingface_hub \
           nvidia/cu13/lib nvidia/cublas tokenspeed_triton tilelang torchcodec z3 \
           nvidia/__init__.py cuda/__init__.py google/__init__.py; do
    if [ -e "$SITE/$p" ]; then REMOVED+=("$p ($(find "$SITE/$p" -type f | wc -l) files, $(du -sb "$SITE/$p" | cut -f1) B)"); rm -rf "${SITE:?}/$p"; fi
  done
  for r in "${REMOVED[@]}"; do log "removed from the bundle: $r"; done
  ndist=$(find "$SITE" -maxdepth 1 -name '*.dist-info' -type d | wc -l)
  [ "$ndist" -eq "${#CARRY_WHEELS[@]}" ] || die "site/ has $ndist .dist-info dirs for ${#CARRY_WHEELS[@]} wheels"
  find "$SITE" -name '__pycache__' -prune -exec rm -rf {} +
  UNPACKED_B=$(du -sb "$SITE" | cut -f1); UNPACKED_FILES=$(find "$SITE" -type f | wc -l)
  stage_done "unpack ($UNPACKED_B B, $UNPACKED_FILES files, $ndist dist-info)"

  python3 - "$SITE" > "$WORK/dists.txt" <<'EOF'
import os, re, sys
site = sys.argv[1]; rows = []
for d in os.listdir(site):
    if d.endswith(".dist-info"):
        meta = open(os.path.join(site, d, "METADATA"), encoding="utf-8").read()
        n = re.search(r"^Name: (.+)$", meta, re.M).group(1).strip(); v = re.search(r"^Version: (.+)$", meta, re.M).group(1).strip()
        rows.append((re.sub(r"[-_.]+", "-", n).lower(), n, v))
for _, n, v in sorted(rows): print(f"{n}=={v}")
EOF
  log "tar | xz $XZ_OPTS (this is the slow part) ..."
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu -C "$SITE" -cf - . \
    | xz $XZ_OPTS -c > "$ARCH.part"
  mv -f "$ARCH.part" "$ARCH"
  {
    printf 'UNPACKED_B=%s\nUNPACKED_FILES=%s\n' "$UNPACKED_B" "$UNPACKED_FILES"
    arr_decl REMOVED "${REMOVED[@]}"; arr_decl DROPPED_DATA "${DROPPED_DATA[@]}"; arr_decl DUPS "${DUPS[@]}"
  } > "$WORK/site.stats"
  [ "$KEEP_SITE" = 1 ] || rm -rf "$SITE"
  stage_done "tar+xz ($(stat -c %s "$ARCH") B)"
fi
[ -s "$WORK/dists.txt" ] || die "no $WORK/dists.txt"
xz -t "$ARCH" || die "$ARCH does not test OK"

# ---------------------------------------------------------------------------------------------------------------
# 5. pieces, SHA256SUMS, MANIFEST.txt, scripts
NEW="$WORK/pieces.new"; rm -rf "$NEW"; mkdir -p "$NEW"
split -b "${PIECE_MIB}M" -d -a 2 "$ARCH" "$NEW/site.tar.xz.p"
mapfile -t PIECES < <(cd "$NEW" && ls site.tar.xz.p[0-9][0-9] | sort)
[ "${#PIECES[@]}" -le 100 ] || die "more than 100 pieces"
WHOLE=$(sha "$ARCH"); ARCH_B=$(stat -c %s "$ARCH")
[ "$(cd "$NEW" && cat "${PIECES[@]}" | sha256sum | cut -d' ' -f1)" = "$WHOLE" ] || die "pieces do not concatenate to site.tar.xz"
( cd "$NEW" && sha256sum "${PIECES[@]}" && echo "$WHOLE  site.tar.xz" ) > "$NEW/SHA256SUMS"

dl_n=0; dl_b=0; carry_b=0
for w in "${ALL_WHEELS[@]}"; do
  [ -f "$CACHE/$w" ] || continue
  s=$(stat -c %s "$CACHE/$w"); dl_n=$((dl_n+1)); dl_b=$((dl_b+s))
  [ -z "${IS_CARRY[$w]:-}" ] || carry_b=$((carry_b+s))
done
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b/1048576}'; }
piece_list=$(cd "$NEW" && for p in "${PIECES[@]}"; do printf '%s (%s B), ' "$p" "$(stat -c %s "$p")"; done)
ndists=$(wc -l < "$WORK/dists.txt")
{
  echo "# MANIFEST -- vLLM 0.26.0 + lm-eval 0.4.13 site bundle for the H200 image"
  echo "# built $(date -u '+%Y-%m-%d %H:%M') UTC on the CPU machine by benchmarks/h200_carry/build_pieces.sh; target: Python 3.12.3, torch 2.11.0+cu130 (image), x86_64 manylinux"
  echo "#"
  echo "# Layout: every bundled wheel unzipped into ONE folder (pip --no-deps style, *.data/purelib|platlib moved to the root;"
  echo "#   *.data/scripts dropped), tar (sorted, owner 0, mtime 0) | xz $XZ_OPTS, split -b ${PIECE_MIB}M -d -a 2."
  echo "# Piece size: ${PIECE_MIB} MiB (verify_local.sh reads this line for its per-piece limit)"
  echo "# On the H200: bash .gpu/h200_unpack.sh   (-> /tmp/site; then export PYTHONPATH=/tmp/site)"
  echo
  echo "## Sizes"
  echo "  bundled distributions:   $ndists"
  echo "  wheels downloaded:       $dl_n files, $dl_b bytes ($(mib $dl_b)) ($([ "$DOWNLOAD_EXCLUDED" = 1 ] && echo "incl. excluded ones" || echo "bundled ones only"))"
  echo "  wheels bundled:          $carry_b bytes ($(mib $carry_b))"
  echo "  total unpacked size:     $UNPACKED_B bytes ($(mib "$UNPACKED_B")), $UNPACKED_FILES files"
  echo "  site.tar.xz:             $ARCH_B bytes ($(mib "$ARCH_B")) in ${#PIECES[@]} pieces: ${piece_list%, }"
  echo "  site.tar.xz sha256:      $WHOLE"
  echo
  echo "## Bundled distributions ($ndists), name==version  [wheel file]"
  sed 's/^/  /' "$WORK/dists.txt"
  echo
  echo "## Wheel files of the bundled distributions"
  printf '  %s\n' "${CARRY_WHEELS[@]}"
  echo
  echo "## Removed after unpacking (verify_local.sh's must-not-be-in-the-bundle list)"
  if [ "${#REMOVED[@]}" -gt 0 ]; then printf '  %s\n' "${REMOVED[@]}"; else echo "  (nothing)"; fi
  echo "## Dropped *.data parts"
  if [ "${#DROPPED_DATA[@]}" -gt 0 ]; then printf '  %s\n' "${DROPPED_DATA[@]}"; else echo "  (nothing)"; fi
  echo "## Files shipped by two wheels (the later wheel's copy kept)"
  if [ "${#DUPS[@]}" -gt 0 ]; then printf '  %s\n' "${DUPS[@]}"; else echo "  (none)"; fi
  echo
  echo "## Deliberately left out: ${#EXCL_NAMES[@]} big / not-needed-for-text-models distributions of the vLLM closure"
  while IFS=$'\t' read -r n why; do
    v=$(awk -F'\t' -v n="$n" '$1 == n {print $2}' "$DL"); echo "  $n==${v:-?}: $why"
  done < "$EXCL"
  echo
  # the prose sections of the committed MANIFEST (FlashInfer kernels, image packages, known conflicts)
  awk '/^## Deliberately left out: FlashInfer/ {on=1} /^## Built here/ {on=0} on' "$OLD_MANIFEST"
  rb=""; for w in "${!REBUILT[@]}"; do rb+="${w%%-py*} (sha256 ${REBUILT[$w]}; dl_list.tsv has ${SHA_OF[$w]} of the first, non-reproducible build), "; done
  echo "## Built here from PyPI sdists (no wheel on PyPI): sqlitedict-2.1.0, word2number-1.1 (pure Python, \`pip wheel --no-deps\` of the sha256-pinned sdist, SOURCE_DATE_EPOCH=$SDE)"
  [ -z "$rb" ] || echo "##   rebuilt for this bundle: ${rb%, }"
  echo "## Copied from this machine's local PyPI mirror (/opt/pypi*, sha256 verified = dl_list.tsv): $(grep -c $'\tfile:///opt/' "$DL") wheels incl. lm_eval 0.4.13"
} > "$NEW/MANIFEST.txt"

mkdir -p "$OUTDIR/pieces"
rm -f "$OUTDIR"/pieces/site.tar.xz.p[0-9][0-9] "$OUTDIR/pieces/SHA256SUMS" "$OUTDIR/pieces/MANIFEST.txt"
mv "$NEW"/* "$OUTDIR/pieces/"; rmdir "$NEW"
for s in h200_stage.sh h200_unpack.sh verify_local.sh; do install -m 0755 "$HERE/$s" "$OUTDIR/$s"; done
EXCLUDE_FILE=$(git -C "$REPO" rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)
case "$EXCLUDE_FILE" in /*) ;; *) EXCLUDE_FILE="$REPO/$EXCLUDE_FILE";; esac
mkdir -p "$(dirname "$EXCLUDE_FILE")"; touch "$EXCLUDE_FILE"
grep -qxF '/.gpu/' "$EXCLUDE_FILE" || { echo '/.gpu/' >> "$EXCLUDE_FILE"; log "added /.gpu/ to $EXCLUDE_FILE"; }
stage_done "split"

log "site.tar.xz: $ARCH_B B ($(mib "$ARCH_B")), sha256 $WHOLE"
(cd "$OUTDIR/pieces" && for p in "${PIECES[@]}"; do printf '  %s %s B\n' "$p" "$(stat -c %s "$p")"; done)
log "wrote $OUTDIR/pieces/{site.tar.xz.p00..p$(printf '%02d' $(( ${#PIECES[@]} - 1 ))),SHA256SUMS,MANIFEST.txt} and $OUTDIR/{h200_stage.sh,h200_unpack.sh,verify_local.sh}"
log "total $(( $(date +%s) - T0 )) s; next: bash $OUTDIR/verify_local.sh"
