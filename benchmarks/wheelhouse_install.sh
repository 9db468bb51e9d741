#!/usr/bin/env bash
# Install a wheelhouse made by benchmarks/wheelhouse_prepare.sh on a GPU node without
# internet (docs/offline-peers.md): join the parts of each split file, check its sha256,
# rebuild a repacked (.tar.xz) wheel, and install every wheel without the package index.
#
#   bash benchmarks/wheelhouse_install.sh [--target DIR] WHEELHOUSE [WHEELHOUSE...]
#
#   WHEELHOUSE  folders holding wheels, parts (FILE.part-aa, ...) and FILE.sha256; the parts of
#               one file may lie in different folders (each transfer's own)
#   --target    install into DIR (pip --target) instead of the current environment, and print
#               the PYTHONPATH that uses it: DIR and DIR/nvidia_cutlass_dsl/dsl_packages (the
#               folder nvidia-cutlass-dsl adds through a .pth file, which --target never runs)
#
# A missing or damaged part stops the install with the file's name and both checksums,
# before anything is installed. PYTHON names the interpreter (default python3).
set -euo pipefail

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
target=""; houses=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target) target="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "wheelhouse_install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [ -d "$1" ] || { echo "wheelhouse_install.sh: $1 is not a folder" >&2; exit 2; }; houses+=("$1"); shift ;;
  esac
done
[ ${#houses[@]} -gt 0 ] || { echo "wheelhouse_install.sh: give at least one WHEELHOUSE folder (see --help)" >&2; exit 2; }
PYTHON="${PYTHON:-python3}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

wheels=()
for house in "${houses[@]}"; do
  for f in "$house"/*.whl; do [ -e "$f" ] && wheels+=("$f"); done
done
# split (and repacked) files: FILE.sha256 beside FILE.part-* in any of the folders
declare -A seen=()
for house in "${houses[@]}"; do
  for sha in "$house"/*.sha256; do
    [ -e "$sha" ] || continue
    name=$(basename "$sha" .sha256)
    [ -z "${seen[$name]:-}" ] || continue
    seen[$name]=1
    parts=()
    for h in "${houses[@]}"; do for p in "$h/$name".part-*; do [ -e "$p" ] && parts+=("$p"); done; done
    if [ ${#parts[@]} -eq 0 ]; then echo "wheelhouse_install.sh: $name: no parts ($name.part-*) found" >&2; exit 1; fi
    # join in suffix order, whichever folder each part lies in
    mapfile -t ordered < <(for p in "${parts[@]}"; do echo "${p##*.part-} $p"; done | sort | cut -d' ' -f2-)
    cat "${ordered[@]}" > "$work/$name"
    want=$(cut -d' ' -f1 < "$sha"); got=$(sha256sum "$work/$name" | cut -d' ' -f1)
    if [ "$want" != "$got" ]; then
      echo "wheelhouse_install.sh: $name joined from ${#parts[@]} parts has sha256 $got, expected $want: a part is missing or damaged" >&2
      exit 1
    fi
    case "$name" in
      *.whl) wheels+=("$work/$name") ;;
      *.whl.tar.xz)
        whl="${name%.tar.xz}"
        mkdir "$work/unpack" && tar -C "$work/unpack" -xJf "$work/$name"
        "$PYTHON" - "$work/$whl" "$work/unpack" <<'PY'
import os, sys, zipfile
out, root = sys.argv[1:]
with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED, strict_timestamps=False) as z:
    for folder, _, files in os.walk(root):
        for f in sorted(files):
            z.write(os.path.join(folder, f), os.path.relpath(os.path.join(folder, f), root))
PY
        rm -rf "$work/unpack" "$work/$name"
        wheels+=("$work/$whl") ;;
      *) echo "wheelhouse_install.sh: $name: not a wheel (.whl or .whl.tar.xz)" >&2; exit 1 ;;
    esac
    echo "joined $name from ${#parts[@]} parts, sha256 ok"
  done
done
[ ${#wheels[@]} -gt 0 ] || { echo "wheelhouse_install.sh: no wheels in ${houses[*]}" >&2; exit 1; }
if [ -n "$target" ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$target" "${wheels[@]}"
  echo "installed ${#wheels[@]} wheels into $target; use them with:"
  echo "  export PYTHONPATH=$target:$target/nvidia_cutlass_dsl/dsl_packages:\${PYTHONPATH:-}"
else
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile "${wheels[@]}"
  echo "installed ${#wheels[@]} wheels"
fi
