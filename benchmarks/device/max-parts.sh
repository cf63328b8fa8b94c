#!/usr/bin/env bash
# Pack Modular MAX for the lent H200 (no network there; a call carries at most 64 MiB with the
# checkout): its wheels unpacked into one site folder, tar + xz (-9e: 244 MB of wheels become
# ~167 MB, against ../shared/device/max-parts.sh's raw wheels), split into .mx1/ .mx2/ ...
# (git-ignored) sized to what a call can carry beside the checkout's tracked files.
#   usage: [MAX_SERVE=1] benchmarks/device/max-parts.sh [MAX_VERSION] [TREE_BYTES]
#     MAX_SERVE=1: MAX's serve extras too (`max generate`, `max serve`: 64-max-pipelines.sh), with
#     the pins pip needs to resolve them (pyproject.toml's max-pipelines extra); more parts
#     TREE_BYTES: the bytes that travel with each part (default: the tracked files now); pass a
#     smaller number when the calls that carry the parts travel with less (fewer, larger parts)
# Then, one call per part, back to back (a machine stays warm 30 s): carry [".mxN"], command
#   mkdir -p /tmp/mx && cp .mxN/* /tmp/mx/
# and run_all.sh unpacks /tmp/mx into /tmp/site (checking SHA256) before it builds maxinstr.
# xz -9e takes ~11 min on a 2-core machine.
set -euo pipefail
ver=${1:-26.7.0}
root=$(git rev-parse --show-toplevel); cd "$root"
tmp=$(mktemp -d)
want=("max==$ver")
if [ "${MAX_SERVE:-0}" = 1 ]; then
  want=("max[serve]==$ver" $(python3 -c 'import re, tomllib; print(" ".join(d for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["max-pipelines"] if not d.startswith("max[")))'))
fi
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$tmp/all" "${want[@]}" 2>&1 | grep -v '^WARNING: Location' || true
mkdir -p "$tmp/site"
# the H200 image already has numpy, click, rich, psutil, typing-extensions, pygments, and (KINDS.md's
# package list) scipy: left out. Every other wheel travels, even where the image has the package,
# so the versions MAX asks for win (/tmp/site comes first on PYTHONPATH): transformers there is 5.17,
# max[serve] wants < 5.13.
for w in "$tmp"/all/*.whl; do
  case $(basename "$w") in numpy-*|click-*|rich-*|psutil-*|typing_extensions-*|pygments-*|markdown_it_py-*|mdurl-*|scipy-*) ;;
    *) unzip -q -o "$w" -d "$tmp/site";;
  esac
done
# a wheel's NAME.data/platlib (and purelib) belong at the site's top, as pip installs them
for d in "$tmp"/site/*.data; do
  for sub in platlib purelib; do [ -d "$d/$sub" ] && cp -a "$d/$sub/." "$tmp/site/"; done
  rm -rf "$d"
done
tar -cf - -C "$tmp/site" . | xz -9e -T0 > "$tmp/max.tar.xz"
tree=${2:-$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)}
part=$(( 63 * 1024 * 1024 - tree - 2 * 1024 * 1024 ))
[ "$part" -gt 8000000 ] || { echo "the checkout leaves too little room per call ($tree bytes)"; exit 1; }
rm -rf .mx[0-9]*; split -b "$part" -d -a 2 "$tmp/max.tar.xz" "$tmp/mxpart."
i=0; for p in "$tmp"/mxpart.*; do i=$((i+1)); mkdir -p ".mx$i"; mv "$p" ".mx$i/"; grep -qx "/.mx$i/" .git/info/exclude 2>/dev/null || echo "/.mx$i/" >> .git/info/exclude; done
sha256sum "$tmp/max.tar.xz" | cut -d' ' -f1 > .mx1/SHA256
echo "MAX $ver: $(du -b "$tmp/max.tar.xz" | cut -f1) bytes in $i parts: $(ls -d .mx[0-9]* | tr '\n' ' ')"
rm -rf "$tmp"
