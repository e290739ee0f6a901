//! The Jetson package (scripts/package.sh) works: its aarch64 binaries, run under qemu-user,
//! answer exactly as the x86-64 build of the same commit, and its maintainer scripts, run in a
//! scratch root with a fake `systemctl` (alone, and run by dpkg itself), make the user and the
//! models folder, call systemd as they should, refuse another board's package and leave the
//! models alone.
//!
//! They need the built package: a plain `cargo test` skips them with a visible line, and
//! scripts/test-package.sh (run by scripts/test.sh right after) builds it, unpacks it with `dpkg-deb -R` and runs them with
//!   LEANSTREAM_DEB       the package file
//!   LEANSTREAM_PKG_ROOT  the unpacked package (its files, and DEBIAN/ with the scripts)
//!   LEANSTREAM_X86_BIN   a folder holding the x86-64 leanstreamd and leanstream

mod common;

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The unpacked package, or None after a `skipped:` line.
fn package_root() -> Option<PathBuf> {
    match std::env::var_os("LEANSTREAM_PKG_ROOT") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!("skipped: LEANSTREAM_PKG_ROOT is not set (scripts/test-package.sh, which scripts/test.sh runs next, sets it and runs this test)");
            None
        }
    }
}

/// How to run the packaged aarch64 binaries here: qemu-user with the cross C library.
fn qemu() -> Option<Vec<String>> {
    let found = Command::new("qemu-aarch64")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("skipped: qemu-aarch64 not found (apt install qemu-user)");
        return None;
    }
    let sysroot = "/usr/aarch64-linux-gnu";
    if !Path::new(sysroot).join("lib").is_dir() {
        eprintln!("skipped: {sysroot} not found (apt install libc6-dev-arm64-cross)");
        return None;
    }
    Some(vec!["qemu-aarch64".into(), "-L".into(), sysroot.into()])
}

/// The aarch64 (under qemu) and x86-64 commands for binary `name`, or None after a skip line.
fn both_builds(name: &str) -> Option<[Vec<String>; 2]> {
    let root = package_root()?;
    let Some(x86) = std::env::var_os("LEANSTREAM_X86_BIN") else {
        eprintln!("skipped: LEANSTREAM_X86_BIN is not set (scripts/test-package.sh sets it)");
        return None;
    };
    let mut arm = qemu()?;
    arm.push(root.join("usr/bin").join(name).display().to_string());
    let x86 = vec![PathBuf::from(x86).join(name).display().to_string()];
    Some([arm, x86])
}

// Both builds run with the same worker count: the split of the work must not differ.
const THREADS: &str = "2";
const PROMPT: &str = "Once upon a time";

struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    fn start(cmd: &[String], model: &Path, tok: &Path, tag: &str) -> Daemon {
        let socket = std::env::temp_dir().join(format!("ls-pkg-{}-{tag}.sock", std::process::id()));
        let child = Command::new(&cmd[0])
            .args(&cmd[1..])
            .arg("--model")
            .arg(model)
            .arg("--tokenizer")
            .arg(tok)
            .arg("--socket")
            .arg(&socket)
            .args(["--threads", THREADS])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
        let started = Instant::now();
        while UnixStream::connect(&socket).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(180),
                "{cmd:?} did not come up"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Daemon { child, socket }
    }

    /// POSTs `body`, returns the status and the response body (the daemon closes each connection).
    fn post(&self, path: &str, body: &str) -> (u16, String) {
        let mut s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(180))).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok());
        (status.unwrap_or(0), body.to_string())
    }

    /// SIGTERM; the exit code, once the process has ended.
    fn stop(mut self) -> i32 {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the daemon did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_file(&self.socket);
    }
}

/// The JSON string value of the first `"key":"..."` (both builds' answers go through it alike).
fn json_string(json: &str, key: &str) -> Option<String> {
    let pat = format!("\"{key}\":\"");
    let start = json.find(&pat)? + pat.len();
    let mut out = String::new();
    let mut chars = json[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                }
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

/// The text of an SSE stream's events, and whether it ended with [DONE].
fn sse_text(body: &str, key: &str) -> (String, bool) {
    let mut text = String::new();
    let mut done = false;
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            done = true;
        } else if let Some(t) = json_string(data, key) {
            text.push_str(&t);
        }
    }
    (text, done)
}

/// One build's daemon on stories260K: a greedy completion, a greedy streamed chat, then
/// SIGTERM (clean exit, socket file removed).
fn daemon_answers(cmd: &[String], model: &Path, tok: &Path, tag: &str) -> (String, String) {
    let d = Daemon::start(cmd, model, tok, tag);
    let (status, body) = d.post(
        "/v1/completions",
        &format!(r#"{{"prompt":"{PROMPT}","max_tokens":40,"temperature":0}}"#),
    );
    assert_eq!(status, 200, "{tag}: {body}");
    assert!(body.contains("\"completion_tokens\":40"), "{tag}: {body}");
    let completion = json_string(&body, "text").expect("a completion text");
    let (status, body) = d.post(
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"Tell me a story."}],"max_tokens":32,"temperature":0,"stream":true}"#,
    );
    assert_eq!(status, 200, "{tag}: {body}");
    let (chat, done) = sse_text(&body, "content");
    assert!(done, "{tag}: the stream did not end with [DONE]: {body}");
    let socket = d.socket.clone();
    assert_eq!(d.stop(), 0, "{tag}: exit code after SIGTERM");
    assert!(
        !socket.exists(),
        "{tag}: the socket file is left after SIGTERM"
    );
    (completion, chat)
}

#[test]
fn aarch64_daemon_answers_as_the_x86_build() {
    let Some([arm, x86]) = both_builds("leanstreamd") else {
        return;
    };
    let Some((model, tok)) = common::stories260k() else {
        return;
    };
    let (x86_completion, x86_chat) = daemon_answers(&x86, &model, &tok, "x86");
    let (arm_completion, arm_chat) = daemon_answers(&arm, &model, &tok, "aarch64");
    assert!(x86_completion.len() > 40, "{x86_completion:?}");
    assert!(!x86_chat.is_empty());
    assert_eq!(arm_completion, x86_completion, "completion: aarch64 vs x86");
    assert_eq!(arm_chat, x86_chat, "streamed chat: aarch64 vs x86");
}

fn cli_generate(cmd: &[String], model: &Path, tok: &Path) -> String {
    let out = Command::new(&cmd[0])
        .args(&cmd[1..])
        .args(["generate", "--model"])
        .arg(model)
        .arg("--tokenizer")
        .arg(tok)
        .args([
            "--prompt",
            PROMPT,
            "--max-tokens",
            "60",
            "--threads",
            THREADS,
        ])
        .output()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn aarch64_cli_generates_as_the_x86_build() {
    let Some([arm, x86]) = both_builds("leanstream") else {
        return;
    };
    let Some((model, tok)) = common::stories260k() else {
        return;
    };
    let expected = cli_generate(&x86, &model, &tok);
    assert!(expected.len() > 60, "{expected:?}");
    assert_eq!(cli_generate(&arm, &model, &tok), expected);
}

/// The package's maintainer scripts run against a scratch root that holds its files, as dpkg
/// runs them when it installs into another root ($DPKG_ROOT), with `systemctl` replaced by a
/// script that records its arguments.
struct ScratchRoot {
    _dir: tempfile::TempDir,
    root: PathBuf,
    scripts: PathBuf,
    fake_bin: PathBuf,
    calls: PathBuf,
}

const UNIT: &str = "leanstreamd.service";

impl ScratchRoot {
    /// `booted`: systemd runs there (`/run/systemd/system` exists), else an image being built.
    fn new(pkg: &Path, booted: bool) -> ScratchRoot {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir(&root).unwrap();
        let copied = Command::new("cp")
            .arg("-a")
            .arg(pkg.join("."))
            .arg(&root)
            .status()
            .unwrap();
        assert!(copied.success());
        fs::remove_dir_all(root.join("DEBIAN")).unwrap();
        if booted {
            fs::create_dir_all(root.join("run/systemd/system")).unwrap();
        }
        let fake_bin = dir.path().join("bin");
        fs::create_dir(&fake_bin).unwrap();
        let calls = dir.path().join("systemctl.calls");
        let systemctl = fake_bin.join("systemctl");
        fs::write(
            &systemctl,
            format!("#!/bin/sh\necho \"$*\" >> '{}'\n", calls.display()),
        )
        .unwrap();
        fs::set_permissions(&systemctl, fs::Permissions::from_mode(0o755)).unwrap();
        ScratchRoot {
            root,
            scripts: pkg.join("DEBIAN"),
            fake_bin,
            calls,
            _dir: dir,
        }
    }

    fn run(&self, script: &str, args: &[&str]) -> Output {
        let path = format!(
            "{}:{}",
            self.fake_bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Command::new(self.scripts.join(script))
            .args(args)
            .env("DPKG_ROOT", &self.root)
            .env("PATH", path)
            .output()
            .unwrap()
    }

    /// Runs `script` and expects success.
    fn ok(&self, script: &str, args: &[&str]) -> Output {
        let out = self.run(script, args);
        assert!(
            out.status.success(),
            "{script} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// The systemctl calls since the last look.
    fn take_calls(&self) -> Vec<String> {
        let text = fs::read_to_string(&self.calls).unwrap_or_default();
        let _ = fs::remove_file(&self.calls);
        text.lines().map(str::to_string).collect()
    }

    /// The uid and gid of `name` in the scratch root's /etc/passwd.
    fn user(&self, name: &str) -> Option<(u32, u32)> {
        let passwd = fs::read_to_string(self.root.join("etc/passwd")).ok()?;
        let f: Vec<&str> = passwd
            .lines()
            .find(|l| l.starts_with(&format!("{name}:")))?
            .split(':')
            .collect();
        Some((f[2].parse().ok()?, f[3].parse().ok()?))
    }
}

/// The scripts' tools, root (systemd-tmpfiles gives the models folder to the service's group),
/// and the package, or None after a `skipped:` line.
fn scripts_can_run() -> Option<PathBuf> {
    let pkg = package_root()?;
    for tool in ["systemd-sysusers", "systemd-tmpfiles"] {
        if Command::new(tool).arg("--version").output().is_err() {
            eprintln!("skipped: {tool} not found (apt install systemd)");
            return None;
        }
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: not root (the scripts change the owner of the models folder)");
        return None;
    }
    Some(pkg)
}

#[test]
fn maintainer_scripts_install_upgrade_refuse_and_remove() {
    let Some(pkg) = scripts_can_run() else {
        return;
    };
    let control = fs::read_to_string(pkg.join("DEBIAN/control")).unwrap();
    let version = control
        .lines()
        .find_map(|l| l.strip_prefix("Version: "))
        .unwrap()
        .to_string();
    let board = fs::read_to_string(pkg.join("etc/leanstream/board")).unwrap();
    let board = board.trim();
    assert!(
        version.ends_with(&format!("+{board}-1")),
        "the version {version} does not name the board {board}"
    );
    let s = ScratchRoot::new(&pkg, true);
    let root = s.root.display().to_string();

    // First install: the user and its group, the models folder, the unit enabled and started.
    s.ok("preinst", &["install"]);
    s.ok("postinst", &["configure", ""]);
    let (_, gid) = s.user("leanstream").expect("the leanstream user");
    let group = fs::read_to_string(s.root.join("etc/group")).unwrap();
    assert!(
        group
            .lines()
            .any(|l| l.starts_with(&format!("leanstream:x:{gid}:"))),
        "{group}"
    );
    let models = s.root.join("var/lib/leanstream");
    let meta = fs::metadata(&models).unwrap();
    assert_eq!(
        (meta.mode() & 0o7777, meta.uid(), meta.gid()),
        (0o750, 0, gid)
    );
    assert_eq!(
        s.take_calls(),
        [
            format!("--root={root} enable {UNIT}"),
            "daemon-reload".to_string(),
            format!("--no-block start {UNIT}"),
        ]
    );
    let model = models.join("model.gguf");
    fs::write(&model, b"the operator's model").unwrap();

    // An upgrade for the same board keeps the enablement and restarts a running daemon; the
    // user made at install is kept.
    let older = version.replacen("+git", "+git1", 1);
    s.ok("preinst", &["upgrade", &older]);
    s.ok("postinst", &["configure", &older]);
    assert_eq!(
        s.take_calls(),
        [
            "daemon-reload".to_string(),
            format!("--no-block try-restart {UNIT}")
        ]
    );
    assert_eq!(s.user("leanstream").unwrap().1, gid);

    // A package for another board is refused over the installed one, with a sentence.
    let other = if board == "jetson-agx-xavier-32gb" {
        "jetson-orin-nano-8gb"
    } else {
        "jetson-agx-xavier-32gb"
    };
    let installed_other = version.replace(&format!("+{board}-1"), &format!("+{other}-1"));
    let refused = s.run("preinst", &["upgrade", &installed_other]);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains(&format!(
            "built for board '{other}' and this one for board '{board}'"
        )) && said.contains("apt remove leanstream"),
        "{said}"
    );
    // dpkg then runs the new postrm abort-upgrade: nothing to undo.
    s.ok("postrm", &["abort-upgrade", &installed_other]);
    assert!(s.take_calls().is_empty());

    // Removal stops the daemon; removal and purge leave the models (and the user) alone.
    s.ok("prerm", &["remove"]);
    assert_eq!(s.take_calls(), [format!("stop {UNIT}")]);
    s.ok("postrm", &["remove"]);
    assert_eq!(s.take_calls(), ["daemon-reload"]);
    let wants = s.root.join("etc/systemd/system/multi-user.target.wants");
    fs::create_dir_all(&wants).unwrap();
    std::os::unix::fs::symlink(format!("/lib/systemd/system/{UNIT}"), wants.join(UNIT)).unwrap();
    let purged = s.ok("postrm", &["purge"]);
    assert_eq!(s.take_calls(), ["daemon-reload"]);
    assert!(
        fs::symlink_metadata(wants.join(UNIT)).is_err(),
        "purge leaves the unit enabled"
    );
    assert_eq!(fs::read(&model).unwrap(), b"the operator's model");
    assert!(s.user("leanstream").is_some());
    assert!(String::from_utf8_lossy(&purged.stderr).contains("left in place"));
}

#[test]
fn maintainer_scripts_in_an_image_build_only_enable() {
    let Some(pkg) = scripts_can_run() else {
        return;
    };
    // No systemd runs in the root being built: the unit is enabled there, nothing is started.
    let s = ScratchRoot::new(&pkg, false);
    s.ok("preinst", &["install"]);
    s.ok("postinst", &["configure", ""]);
    assert_eq!(
        s.take_calls(),
        [format!("--root={} enable {UNIT}", s.root.display())]
    );
    assert!(s.user("leanstream").is_some());
    assert!(s.root.join("var/lib/leanstream").is_dir());
    s.ok("prerm", &["remove"]);
    s.ok("postrm", &["remove"]);
    assert!(s.take_calls().is_empty());
}

/// dpkg itself, installing into a scratch root (`--root`, the scripts run chrootless with
/// $DPKG_ROOT): the package installs, another board's package is refused over it and the
/// installed one stays, a reinstall of the same board passes, and purge keeps the models.
#[test]
fn dpkg_installs_refuses_another_board_and_purges_keeping_the_models() {
    let Some(pkg) = scripts_can_run() else {
        return;
    };
    let Some(deb) = std::env::var_os("LEANSTREAM_DEB").map(PathBuf::from) else {
        eprintln!("skipped: LEANSTREAM_DEB is not set (scripts/test-package.sh sets it)");
        return;
    };
    if Command::new("dpkg").arg("--version").output().is_err() {
        eprintln!("skipped: dpkg not found");
        return;
    }
    let board = fs::read_to_string(pkg.join("etc/leanstream/board")).unwrap();
    let board = board.trim().to_string();
    let other = if board == "jetson-agx-xavier-32gb" {
        "jetson-agx-orin-64gb"
    } else {
        "jetson-agx-xavier-32gb"
    };
    // Another board's package: this one with the board renamed where the package names it.
    let s = ScratchRoot::new(&pkg, false);
    let work = s.root.parent().unwrap().to_path_buf();
    let other_tree = work.join("other");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(&pkg)
        .arg(&other_tree)
        .status()
        .unwrap();
    assert!(copied.success());
    for file in ["DEBIAN/control", "DEBIAN/preinst", "etc/leanstream/board"] {
        let path = other_tree.join(file);
        let text = fs::read_to_string(&path).unwrap().replace(&board, other);
        fs::write(&path, text).unwrap();
    }
    let other_deb = work.join("other.deb");
    let built = Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zgzip", "--build"])
        .arg(&other_tree)
        .arg(&other_deb)
        .output()
        .unwrap();
    assert!(built.status.success(), "{built:?}");

    // An empty dpkg database in the scratch root (its files from the package are removed).
    fs::remove_dir_all(&s.root).unwrap();
    fs::create_dir_all(s.root.join("var/lib/dpkg/info")).unwrap();
    fs::create_dir_all(s.root.join("var/lib/dpkg/updates")).unwrap();
    fs::write(s.root.join("var/lib/dpkg/status"), "").unwrap();
    let dpkg = |args: &[&std::ffi::OsStr]| -> Output {
        let path = format!(
            "{}:{}",
            s.fake_bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Command::new("dpkg")
            .arg(format!("--root={}", s.root.display()))
            .args([
                "--force-architecture",
                "--force-depends",
                "--force-script-chrootless",
                "--log=/dev/null",
            ])
            .args(args)
            .env("PATH", path)
            .output()
            .unwrap()
    };
    let installed = || -> String {
        let status = fs::read_to_string(s.root.join("var/lib/dpkg/status")).unwrap();
        let para = status
            .split("\n\n")
            .find(|p| p.starts_with("Package: leanstream\n"))
            .unwrap_or("")
            .to_string();
        para.lines()
            .filter(|l| l.starts_with("Status: ") || l.starts_with("Version: "))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let ok = |out: Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        )
    };

    ok(dpkg(&["-i".as_ref(), deb.as_os_str()]));
    let first = installed();
    assert!(
        first.contains("install ok installed") && first.contains(&format!("+{board}-1")),
        "{first}"
    );
    assert_eq!(
        fs::read_to_string(s.root.join("etc/leanstream/board")).unwrap(),
        format!("{board}\n")
    );
    fs::write(s.root.join("var/lib/leanstream/model.gguf"), b"model").unwrap();

    let refused = dpkg(&["-i".as_ref(), other_deb.as_os_str()]);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains(&format!(
            "built for board '{board}' and this one for board '{other}'"
        )),
        "{said}"
    );
    assert_eq!(
        installed(),
        first,
        "the refused package changed the installed one"
    );

    // The same package again (an upgrade's path through the scripts) passes.
    ok(dpkg(&["-i".as_ref(), deb.as_os_str()]));
    assert_eq!(installed(), first);

    ok(dpkg(&["--purge".as_ref(), "leanstream".as_ref()]));
    assert!(!s.root.join("etc/leanstream").exists());
    assert!(!s.root.join("usr/bin/leanstreamd").exists());
    assert_eq!(
        fs::read(s.root.join("var/lib/leanstream/model.gguf")).unwrap(),
        b"model"
    );
}
