#!/bin/sh
# Build the patched pyfuse3 wheel into OUT (README.md says what the patch is and why).
#   vendor/pyfuse3/build.sh PIP OUT
# Downloads the pinned upstream sdist from the package index, checks its
# SHA-256, applies inode-requests.patch and builds a wheel with pinned
# Cython and setuptools. Skipped when OUT already holds the wheel of this
# exact patch (its hash is part of the wheel's folder name).
set -eu
pip=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
upstream=3.5.0
sdist_sha256=88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24
patch_id=$(cat "$here/inode-requests.patch" "$here/build-constraints.txt" | sha256sum | cut -c1-16)
wheels="$out/wheel-$patch_id"
if ls "$wheels"/pyfuse3-*.whl >/dev/null 2>&1; then
    exit 0
fi
echo "building pyfuse3 $upstream with vendor/pyfuse3/inode-requests.patch"
rm -rf "$out" && mkdir -p "$out/src"
"$pip" download -q --no-deps --no-binary :all: -d "$out" "pyfuse3==$upstream"
echo "$sdist_sha256  $out/pyfuse3-$upstream.tar.gz" | sha256sum -c --quiet
tar -xzf "$out/pyfuse3-$upstream.tar.gz" -C "$out/src"
(cd "$out/src/pyfuse3-$upstream" && patch -s -p1 < "$here/inode-requests.patch")
PIP_CONSTRAINT="$here/build-constraints.txt" "$pip" wheel -q --no-deps -w "$wheels.partial" "$out/src/pyfuse3-$upstream"
mv "$wheels.partial" "$wheels"
