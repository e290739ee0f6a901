#!/usr/bin/env bash
# Builds the Debian package of LeanStream for one Jetson board (JetPack's Ubuntu, arm64):
#   scripts/package.sh BOARD [OUT_DIR]        e.g. scripts/package.sh jetson-orin-nano-8gb
# Cross-compiles leanstreamd and leanstream for aarch64-unknown-linux-gnu with
# board-configs/BOARD.toml compiled in, stages them with the systemd unit, the sysusers and
# tmpfiles entries, /etc/leanstream (board name, model path) and the docs, and writes
# OUT_DIR/leanstream_VERSION_arm64.deb (OUT_DIR: target/debian). Prints the package's path.
# VERSION = crate version + "+git" commit time (UTC) "." commit hash [".dirty"] "+" BOARD "-1":
# later commits sort higher, and the board after the last '+' is what preinst compares.
# Extra cargo options (e.g. --no-default-features for a CPU-only build) in $LEANSTREAM_CARGO_FLAGS.
# Needs: rustup's aarch64-unknown-linux-gnu target, gcc-aarch64-linux-gnu, dpkg-deb, git.
set -euo pipefail
cd "$(dirname "$0")/.."
board=${1:?usage: scripts/package.sh BOARD [OUT_DIR] (a board-configs/*.toml name)}
out=${2:-target/debian}
target=aarch64-unknown-linux-gnu
[ -f "board-configs/$board.toml" ] || {
  echo "package.sh: no board-configs/$board.toml (boards: $(cd board-configs && ls -- *.toml | sed 's/\.toml$//' | tr '\n' ' '))" >&2
  exit 2
}
for tool in git dpkg-deb aarch64-linux-gnu-gcc aarch64-linux-gnu-strip aarch64-linux-gnu-objdump; do
  command -v "$tool" >/dev/null || { echo "package.sh: $tool is missing (apt install git dpkg-dev gcc-aarch64-linux-gnu)" >&2; exit 2; }
done

# The build: the binaries by name, so it works from the workspace root whichever package holds them.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# shellcheck disable=SC2086 # the flags are words
LEANSTREAM_BOARD="$board" cargo build --release --target "$target" ${LEANSTREAM_CARGO_FLAGS:-} \
  --bin leanstreamd --bin leanstream >&2
bin_dir=${CARGO_TARGET_DIR:-target}/$target/release

crate_version=$(cargo pkgid leanstream | sed 's/.*[#@]//')
commit=$(git rev-parse --short=12 HEAD)
commit_time=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S HEAD)
dirty=$(git status --porcelain --untracked-files=no | grep -q . && echo .dirty || true)
version="$crate_version+git$commit_time.$commit$dirty+$board-1"
maintainer=${DEBFULLNAME:+$DEBFULLNAME <${DEBEMAIL:-}>}
maintainer=${maintainer:-$(git log -1 --format='%cn <%ce>' HEAD)}
# Reproducible: every file's time is the commit's.
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct HEAD)
export SOURCE_DATE_EPOCH

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
doc=$root/usr/share/doc/leanstream
install -d "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" "$root/usr/lib/sysusers.d" \
  "$root/usr/lib/tmpfiles.d" "$root/etc/leanstream" "$doc/examples" "$root/usr/share/lintian/overrides"
for b in leanstreamd leanstream; do
  aarch64-linux-gnu-strip --strip-unneeded --remove-section=.comment -o "$root/usr/bin/$b" "$bin_dir/$b"
  chmod 0755 "$root/usr/bin/$b"
done
install -m 0644 packaging/leanstreamd.service "$root/lib/systemd/system/leanstreamd.service"
install -m 0644 packaging/sysusers.conf "$root/usr/lib/sysusers.d/leanstream.conf"
install -m 0644 packaging/tmpfiles.conf "$root/usr/lib/tmpfiles.d/leanstream.conf"
install -m 0644 packaging/leanstreamd.conf "$root/etc/leanstream/leanstreamd.conf"
echo "$board" > "$root/etc/leanstream/board"
chmod 0644 "$root/etc/leanstream/board"
install -m 0644 packaging/gpu.conf "$doc/examples/gpu.conf"
install -m 0644 "board-configs/$board.toml" "$doc/board-$board.toml"
install -m 0644 docs/INSTALL-JETSON.md "$doc/INSTALL-JETSON.md"
gzip -9n < README.md > "$doc/README.md.gz"
sed "s/@YEAR@/$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y)/" packaging/deb/copyright > "$doc/copyright"
install -m 0644 packaging/deb/lintian-overrides "$root/usr/share/lintian/overrides/leanstream"
{
  echo "leanstream ($version) unstable; urgency=medium"
  echo
  echo "  * Built from commit $commit$dirty for board $board:"
  echo "    $(git log -1 --format=%s HEAD | cut -c1-66)"
  echo
  echo " -- $maintainer  $(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n > "$doc/changelog.Debian.gz"
chmod 0644 "$doc"/*.gz

for s in preinst postinst prerm postrm; do
  sed "s/@BOARD@/$board/g" "packaging/deb/$s" > "$root/DEBIAN/$s"
  chmod 0755 "$root/DEBIAN/$s"
done
printf '/etc/leanstream/leanstreamd.conf\n/etc/leanstream/board\n' > "$root/DEBIAN/conffiles"
# The oldest C library the binaries can run on: the newest symbol version they ask for.
glibc=$(aarch64-linux-gnu-objdump -T "$root/usr/bin/leanstreamd" "$root/usr/bin/leanstream" \
  | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
description=$(sed -n "s/^description *= *\"\(.*\)\"/\1/p" "board-configs/$board.toml")
cat > "$root/DEBIAN/control" <<EOF
Package: leanstream
Version: $version
Architecture: arm64
Maintainer: $maintainer
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: libc6 (>= $glibc), libgcc-s1, systemd
Section: misc
Priority: optional
Description: fixed-memory LLM inference daemon, built for the $board
 LeanStream serves an OpenAI-compatible HTTP API on a Unix socket
 (/run/leanstream/leanstream.sock) as the hardened systemd service
 leanstreamd, and its CLI, leanstream, generates offline or talks to it.
 .
 This package is built for one board:
   $description.
 Its memory budgets and limits are compiled in; they are listed in
 /usr/share/doc/leanstream/board-$board.toml.
 Put a model at the path in /etc/leanstream/leanstreamd.conf, then
 systemctl enable --now leanstreamd.
EOF
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"

mkdir -p "$out"
deb="$out/leanstream_${version}_arm64.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >&2
echo "$deb"
