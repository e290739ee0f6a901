#!/usr/bin/env bash
# The Jetson package, as CI checks it (scripts/test.sh runs this after the aarch64 kernel tests):
#   scripts/test-package.sh [BOARD]        (default jetson-orin-nano-8gb)
# builds it (scripts/package.sh), checks that its binaries need no glibc newer than JetPack 5's
# 2.31, checks it with lintian, its unit with `systemd-analyze verify`
# and `security` (alone and with the GPU drop-in), then runs the tests of
# tests/package.rs against it: the packaged aarch64 leanstreamd and leanstream under qemu-user
# answer as the x86-64 build does, and the maintainer scripts, alone and run by dpkg, do their
# work in a scratch root.
# A missing tool prints `skipped: ...` and the rest still runs.
set -euo pipefail
cd "$(dirname "$0")/.."
board=${1:-jetson-orin-nano-8gb}
target=aarch64-unknown-linux-gnu
# The exposure `systemd-analyze security` may give the shipped unit (0 best, 10 worst).
max_exposure=1.0
skip() { echo "skipped: package: $1"; }

rustup target list --installed 2>/dev/null | grep -qx "$target" \
  || { skip "the $target standard library is missing (scripts/test-aarch64.sh adds it)"; exit 0; }
for tool in aarch64-linux-gnu-gcc dpkg-deb; do
  command -v "$tool" >/dev/null || { skip "$tool is missing (apt install gcc-aarch64-linux-gnu dpkg-dev)"; exit 0; }
done

# package.sh links with zig (cargo-zigbuild) for glibc $glibc_ceiling, both from PyPI like
# scripts/test.sh's Python tools; without them it links with gcc and the check below fails.
glibc_ceiling=2.31
python3 -m pip install --quiet "ziglang==0.17.*" "cargo-zigbuild==0.24.*" \
  || echo "package: pip could not install ziglang and cargo-zigbuild" >&2

deb=$(scripts/package.sh "$board")
echo "package: $deb: $(stat -c %s "$deb") bytes, installed $(dpkg-deb -f "$deb" Installed-Size) KiB"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pkg=$work/pkg
dpkg-deb -R "$deb" "$pkg"

# The glibc ceiling: no symbol of either binary may need a glibc newer than JetPack 5's, and the
# package's Depends must say what they do need.
needed=
for bin in leanstreamd leanstream; do
  versions=$(aarch64-linux-gnu-objdump -T "$pkg/usr/bin/$bin" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV)
  [ -n "$versions" ] || { echo "package: $bin: objdump -T lists no GLIBC_ symbol version" >&2; exit 1; }
  above=$(printf '%s\n%s\n' "$glibc_ceiling" "$versions" | sort -uV | sed "1,/^$glibc_ceiling\$/d")
  if [ -n "$above" ]; then
    echo "package: $bin needs glibc above $glibc_ceiling (JetPack 5), so the package will not install there; its symbols:" >&2
    aarch64-linux-gnu-objdump -T "$pkg/usr/bin/$bin" | grep -F -e "$(printf '(GLIBC_%s)\n' $above)" >&2
    exit 1
  fi
  needed=$(printf '%s\n%s\n' "$needed" "$versions" | sed '/^$/d' | sort -uV)
  echo "package: $bin needs glibc $(printf '%s\n' "$versions" | tail -1) at most (ceiling $glibc_ceiling)"
done
depends=$(dpkg-deb -f "$deb" Depends)
case ", $depends," in
  *", libc6 (>= $(printf '%s\n' "$needed" | tail -1)),"*) echo "package: Depends: $depends" ;;
  *) echo "package: Depends: '$depends' does not ask for the glibc $(printf '%s\n' "$needed" | tail -1) the binaries need" >&2; exit 1 ;;
esac

# lintian: errors and warnings fail (the package's overrides explain the ones left).
if ! command -v lintian >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  { apt-get install -y -q lintian || { apt-get update -q && apt-get install -y -q lintian; }; } >/dev/null 2>&1 || true
fi
if command -v lintian >/dev/null; then
  said=$(lintian --fail-on error,warning "$deb" 2>&1) \
    || { printf '%s\n' "$said" >&2; echo "package: lintian fails $deb" >&2; exit 1; }
  echo "package: lintian clean (the warnings left are explained in packaging/deb/lintian-overrides)"
else
  skip "lintian not found (apt install lintian)"
fi

# systemd-analyze checks the unit's executables in the root it is given: a root holding the
# host's units (the targets it names), /bin/sh (ExecCondition=) and the package's files.
if command -v systemd-analyze >/dev/null; then
  units=
  for d in /usr/lib/systemd/system /lib/systemd/system; do
    [ -e "$d/sysinit.target" ] && { units=$d; break; }
  done
  if [ -z "$units" ]; then
    skip "systemd-analyze: the host's systemd units are not installed"
  else
    vroot=$work/vroot
    mkdir -p "$vroot/usr/lib/systemd" "$vroot/usr/bin"
    ln -s usr/lib "$vroot/lib"
    ln -s usr/bin "$vroot/bin"
    cp -a "$units" "$vroot/usr/lib/systemd/system"
    cp -a "$pkg/lib/systemd/system/." "$vroot/usr/lib/systemd/system/"
    cp -a "$pkg/usr/bin/." "$vroot/usr/bin/"
    cp -a "$pkg/etc" "$vroot/"
    cp "$(command -v sh)" "$vroot/usr/bin/sh"
    check_unit() { # $1: what is checked
      local said
      said=$(systemd-analyze verify --root="$vroot" /lib/systemd/system/leanstreamd.service 2>&1) \
        && [ -z "$said" ] || { echo "package: systemd-analyze verify ($1): $said" >&2; exit 1; }
      exposure=$(systemd-analyze security --offline=yes --root="$vroot" leanstreamd.service 2>&1 \
        | sed -n 's/.*Overall exposure level for leanstreamd.service: \([0-9.]*\).*/\1/p')
      [ -n "$exposure" ] || { echo "package: systemd-analyze security ($1) gave no score" >&2; exit 1; }
      echo "package: systemd-analyze verify ($1): clean; security: exposure $exposure"
    }
    check_unit "leanstreamd.service"
    awk -v e="$exposure" -v m="$max_exposure" 'BEGIN { exit !(e <= m) }' \
      || { echo "package: the unit's exposure $exposure is above $max_exposure" >&2; exit 1; }
    mkdir -p "$vroot/etc/systemd/system/leanstreamd.service.d"
    cp "$pkg/usr/share/doc/leanstream/examples/gpu.conf" "$vroot/etc/systemd/system/leanstreamd.service.d/"
    check_unit "with the GPU drop-in"
  fi
else
  skip "systemd-analyze not found (apt install systemd)"
fi

# The x86-64 reference: the binaries of the tests' own build (the same features as
# scripts/test.sh's `cargo test` of the workspace, so nothing is rebuilt there); built when that
# build lacks one (a package without integration tests does not build its binaries).
x86=$work/x86
mkdir -p "$x86"
link_bins() { # cargo's JSON messages on stdin: links the leanstreamd and leanstream built
  python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and t.get("kind") == ["bin"] and m.get("executable") \
            and not m["profile"]["test"] and t["name"] in ("leanstreamd", "leanstream"):
        dst = os.path.join(sys.argv[1], t["name"])
        if not os.path.lexists(dst):
            os.symlink(m["executable"], dst)' "$x86"
}
cargo test --workspace --no-run --message-format=json-render-diagnostics | link_bins
for name in leanstreamd leanstream; do
  [ -e "$x86/$name" ] || cargo build --bin "$name" --message-format=json-render-diagnostics | link_bins
  [ -x "$x86/$name" ] || { echo "package: no x86-64 $name was built" >&2; exit 1; }
done
LEANSTREAM_DEB=$(realpath "$deb") LEANSTREAM_PKG_ROOT=$pkg LEANSTREAM_X86_BIN=$x86 cargo test --test package -- --show-output
