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
# The binaries are linked by zig (cargo-zigbuild) against glibc 2.31's symbol versions, so one
# package runs on JetPack 5 (Ubuntu 20.04, glibc 2.31) and JetPack 6 (2.35) whatever glibc the
# build machine has. Without cargo-zigbuild and zig (pip install ziglang cargo-zigbuild), or with
# LEANSTREAM_LINKER=gcc, they are linked by aarch64-linux-gnu-gcc against this machine's glibc
# instead, said on stderr: such a package needs that glibc (its Depends: libc6 says which).
# Needs: rustup's aarch64-unknown-linux-gnu target, gcc-aarch64-linux-gnu (binutils: strip,
# objdump), dpkg-deb, git; and cargo-zigbuild with zig.
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

# The oldest glibc the binaries are linked for: JetPack 5's (Ubuntu 20.04).
glibc_ceiling=2.31
# cargo-zigbuild from PATH, or from where pip put it (pip's scripts folder, or the user one).
zigbuild=$(command -v cargo-zigbuild || true)
if [ -z "$zigbuild" ]; then
  for scheme in "" posix_user; do
    d=$(python3 -c 'import sys, sysconfig; print(sysconfig.get_path("scripts", *sys.argv[1:]))' ${scheme:+"$scheme"} 2>/dev/null) || continue
    [ -x "$d/cargo-zigbuild" ] && { zigbuild=$d/cargo-zigbuild; break; }
  done
fi
# zig itself: on PATH, or PyPI's ziglang (cargo-zigbuild runs `python3 -m ziglang`).
has_zig() { command -v zig >/dev/null || python3 -c 'import ziglang' 2>/dev/null; }
linker=${LEANSTREAM_LINKER:-zig}
case $linker in
  zig)
    if [ -z "$zigbuild" ] || ! has_zig; then
      echo "package.sh: cargo-zigbuild or zig is missing (pip install ziglang cargo-zigbuild):" \
        "linking with aarch64-linux-gnu-gcc against this machine's aarch64 glibc (/usr/aarch64-linux-gnu)," \
        "so the package may not install where glibc is older (JetPack 5 has $glibc_ceiling; its Depends: libc6 says)" >&2
      linker=gcc
    fi ;;
  gcc) echo "package.sh: LEANSTREAM_LINKER=gcc: linking with aarch64-linux-gnu-gcc against this machine's aarch64 glibc" >&2 ;;
  *) echo "package.sh: LEANSTREAM_LINKER is zig (the default) or gcc, not '$linker'" >&2; exit 2 ;;
esac

# The build: the binaries by name, so it works from the workspace root whichever package holds them.
# cargo-zigbuild reads the glibc version from the target's suffix and builds for $target (the
# same target folder). Its linker is part of cargo's fingerprint: scripts/test-aarch64.sh links
# with the same one, so the dependencies it built are not rebuilt here.
if [ "$linker" = zig ]; then
  # (A linker set in the environment would take the place of zig's.)
  # shellcheck disable=SC2086 # the flags are words
  LEANSTREAM_BOARD="$board" env -u CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER "$zigbuild" zigbuild --release --target "$target.$glibc_ceiling" \
    ${LEANSTREAM_CARGO_FLAGS:-} --bin leanstreamd --bin leanstream >&2 \
    || { echo "package.sh: cargo zigbuild failed (above); LEANSTREAM_LINKER=gcc links with aarch64-linux-gnu-gcc instead, for this machine's glibc" >&2; exit 1; }
else
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
  # shellcheck disable=SC2086 # the flags are words
  LEANSTREAM_BOARD="$board" cargo build --release --target "$target" ${LEANSTREAM_CARGO_FLAGS:-} \
    --bin leanstreamd --bin leanstream >&2
fi
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
# The commit's subject on one changelog line: cut at a word, so that no half word is left for
# lintian's spelling check to read ("agains" of "against").
subject=$(git log -1 --format=%s HEAD)
if [ ${#subject} -gt 66 ]; then subject="${subject:0:63}"; subject="${subject% *}..."; fi
{
  echo "leanstream ($version) unstable; urgency=medium"
  echo
  echo "  * Built from commit $commit$dirty for board $board:"
  echo "    $subject"
  echo
  echo " -- $maintainer  $(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n > "$doc/changelog.Debian.gz"
chmod 0644 "$doc"/*.gz

for s in preinst postinst prerm postrm; do
  sed "s/@BOARD@/$board/g" "packaging/deb/$s" > "$root/DEBIAN/$s"
  chmod 0755 "$root/DEBIAN/$s"
done
printf '/etc/leanstream/leanstreamd.conf\n/etc/leanstream/board\n' > "$root/DEBIAN/conffiles"
# The oldest C library the binaries can run on: the newest symbol version they ask for
# (at most $glibc_ceiling when zig linked them).
glibc=$(aarch64-linux-gnu-objdump -T "$root/usr/bin/leanstreamd" "$root/usr/bin/leanstream" \
  | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
# libgcc_s (unwinding) only when the binaries load it: gcc's link does, zig's links its own
# unwinder in.
libgcc=
aarch64-linux-gnu-objdump -p "$root/usr/bin/leanstreamd" "$root/usr/bin/leanstream" \
  | grep -q 'NEEDED *libgcc_s\.so' && libgcc=" libgcc-s1,"
description=$(sed -n "s/^description *= *\"\(.*\)\"/\1/p" "board-configs/$board.toml")
cat > "$root/DEBIAN/control" <<EOF
Package: leanstream
Version: $version
Architecture: arm64
Maintainer: $maintainer
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: libc6 (>= $glibc),$libgcc systemd
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
