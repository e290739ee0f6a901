//! The board config validator: every shipped board passes, every kind of mistake names its field.

use super::config::{emit_consts, parse_board, parse_size, slot_bytes, DEFAULT_OUTBOX_BYTES};

const HOST: &str = include_str!("../../board-configs/host.toml");

fn with(find: &str, replace: &str) -> String {
    assert!(
        HOST.contains(find),
        "fixture text '{find}' not in host.toml"
    );
    HOST.replacen(find, replace, 1)
}

fn field_of(text: &str) -> String {
    parse_board(text)
        .expect_err("config should be refused")
        .field
}

#[test]
fn every_shipped_board_is_valid() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/board-configs");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let board = parse_board(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(path.file_stem().unwrap().to_str().unwrap(), board.name);
            n += 1;
        }
    }
    assert_eq!(n, 5, "host, three Jetsons and the H200 stand-in");
}

#[test]
fn generated_consts_match_host_board() {
    // The build uses host.toml unless LEANSTREAM_BOARD says otherwise.
    if super::NAME == "host" {
        assert_eq!(super::DENSE_WEIGHTS_BYTES, 1536 << 20);
        assert_eq!(super::FLAGS_BYTES, 1 << 20);
        assert_eq!(super::GPU_ARCH, super::GpuArch::None);
        assert_eq!(super::ALLOWED_UIDS, &[0, 1000]);
    }
}

#[test]
fn sizes_parse_with_units() {
    assert_eq!(parse_size("f", "4096").unwrap(), 4096);
    assert_eq!(parse_size("f", "64 KiB").unwrap(), 64 << 10);
    assert_eq!(parse_size("f", "512 MiB").unwrap(), 512 << 20);
    assert_eq!(parse_size("f", "2GiB").unwrap(), 2 << 30);
    assert!(parse_size("f", "12 TB").is_err());
    assert!(parse_size("f", "MiB").is_err());
    assert!(parse_size("f", "99999999999999999999 GiB").is_err());
}

#[test]
fn zero_or_negative_sizes_name_their_field() {
    assert_eq!(
        field_of(&with("kv = \"512 MiB\"", "kv = \"0 MiB\"")),
        "budget.kv"
    );
    assert_eq!(
        field_of(&with("cpu_threads = 2", "cpu_threads = 0")),
        "board.cpu_threads"
    );
    assert_eq!(
        field_of(&with("max_context = 4096", "max_context = -1")),
        "limits.max_context"
    );
    assert_eq!(field_of(&with("lanes = 4", "lanes = 0")), "io.lanes");
}

#[test]
fn misaligned_budget_is_refused() {
    let e = parse_board(&with("flags = \"1 MiB\"", "flags = \"1000\"")).unwrap_err();
    assert_eq!(e.field, "budget.flags");
    assert!(e.message.contains("4096"), "{e}");
}

#[test]
fn budgets_must_fit_the_board() {
    let e = parse_board(&with(
        "usable_memory = \"8 GiB\"",
        "usable_memory = \"2 GiB\"",
    ))
    .unwrap_err();
    assert_eq!(e.field, "budget");
    assert!(e.message.contains("usable_memory"), "{e}");
}

#[test]
fn request_buffers_must_hold_every_client() {
    // 16 slots of 2 x 64 KiB (the request and its text) + the 64 KiB output buffer + the 4 KiB
    // send chunk: 3.06 MiB. 3 MiB held the old count (one request per slot) but not what the
    // server makes.
    let text = with(
        "request_buffers = \"20 MiB\"",
        "request_buffers = \"3 MiB\"",
    );
    assert_eq!(field_of(&text), "budget.request_buffers");
    assert_eq!(slot_bytes(65536, DEFAULT_OUTBOX_BYTES), 200704);
}

#[test]
fn enums_and_their_pairing_are_checked() {
    assert_eq!(
        field_of(&with("gpu_arch = \"none\"", "gpu_arch = \"sm_99\"")),
        "board.gpu_arch"
    );
    assert_eq!(
        field_of(&with("memory_model = \"none\"", "memory_model = \"fast\"")),
        "board.memory_model"
    );
    assert_eq!(
        field_of(&with("gpu_arch = \"none\"", "gpu_arch = \"sm_87\"")),
        "board.memory_model"
    );
}

#[test]
fn socket_rules() {
    assert_eq!(
        field_of(&with(
            "path = \"/tmp/leanstream.sock\"",
            "path = \"rel.sock\""
        )),
        "socket.path"
    );
    let long = format!("path = \"/{}\"", "x".repeat(200));
    assert_eq!(
        field_of(&with("path = \"/tmp/leanstream.sock\"", &long)),
        "socket.path"
    );
    assert_eq!(
        field_of(&with("mode = 0o660", "mode = 0o666")),
        "socket.mode"
    );
    assert_eq!(
        field_of(&with("allowed_uids = [0, 1000]", "allowed_uids = [-5]")),
        "socket.allowed_uids"
    );
    let none = with("allowed_uids = [0, 1000]", "allowed_uids = []").replacen(
        "allowed_gids = [0, 1000]",
        "allowed_gids = []",
        1,
    );
    assert_eq!(field_of(&none), "socket.allowed_uids");
}

#[test]
fn io_alignment_is_a_power_of_two() {
    assert_eq!(
        field_of(&with("block_align = 4096", "block_align = 3000")),
        "io.block_align"
    );
}

#[test]
fn merged_reads_fit_a_lanes_buffers() {
    assert_eq!(
        field_of(&with("merge_blocks = 16", "merge_blocks = 65")),
        "io.merge_blocks"
    );
    assert_eq!(
        field_of(&with("merge_blocks = 16", "merge_blocks = 0")),
        "io.merge_blocks"
    );
}

#[test]
fn prefill_batch_is_bounded() {
    assert_eq!(
        field_of(&with("prefill_batch = 16", "prefill_batch = 65")),
        "limits.prefill_batch"
    );
    assert_eq!(
        field_of(&with("prefill_batch = 16", "prefill_batch = 0")),
        "limits.prefill_batch"
    );
    assert_eq!(
        parse_board(&with("prefill_batch = 16", "prefill_batch = 1"))
            .unwrap()
            .prefill_batch,
        1
    );
}

#[test]
fn gpu_prefill_batch_defaults_to_prefill_batch_and_is_bounded() {
    let host = parse_board(HOST).unwrap();
    assert_eq!(host.gpu_prefill_batch, host.prefill_batch);
    let extra = |n: &str| {
        with(
            "prefill_batch = 16",
            &format!("prefill_batch = 16\ngpu_prefill_batch = {n}"),
        )
    };
    assert_eq!(parse_board(&extra("512")).unwrap().gpu_prefill_batch, 512);
    assert!(emit_consts(&parse_board(&extra("512")).unwrap())
        .contains("pub const GPU_PREFILL_BATCH: usize = 512;"));
    for bad in ["0", "4097"] {
        assert_eq!(field_of(&extra(bad)), "limits.gpu_prefill_batch", "{bad}");
    }
}

#[test]
fn unknown_or_missing_fields_are_refused() {
    assert_eq!(field_of(&with("[io]", "[io]\nspeed = 3")), "toml");
    assert_eq!(field_of(&with("lanes = 4", "# lanes = 4")), "toml");
}

#[test]
fn emitted_consts_cover_every_budget() {
    let v = parse_board(HOST).unwrap();
    let src = super::config::emit_consts(&v);
    for name in [
        "DENSE_WEIGHTS",
        "FFN_CACHE",
        "KV",
        "ACTIVATION_SCRATCH",
        "IO_STAGING",
        "FLAGS",
        "REQUEST_BUFFERS",
    ] {
        assert!(
            src.contains(&format!("pub const {name}_BYTES: usize = ")),
            "{name} missing"
        );
    }
    assert!(src.contains("pub const SOCKET_MODE: u32 = 0o660;"));
}

#[test]
fn dvfs_is_for_a_jetson_only() {
    // The host (no GPU) and a discrete GPU keep their clocks.
    assert_eq!(
        field_of(&with("cpu_threads = 2", "cpu_threads = 2\ndvfs = true")),
        "board.dvfs"
    );
    let h200 = include_str!("../../board-configs/h200-hil.toml");
    let text = h200.replacen("[board]", "[board]\ndvfs = true", 1);
    assert_eq!(field_of(&text), "board.dvfs");
    let orin = include_str!("../../board-configs/jetson-agx-orin-64gb.toml");
    let v = parse_board(&orin.replacen("[board]", "[board]\ndvfs = true", 1)).unwrap();
    assert!(v.dvfs);
    assert!(emit_consts(&v).contains("pub const DVFS: bool = true;"));
    assert!(emit_consts(&v).contains(
        "pub const DVFS_GPU_MAX_FREQ: &str = \"/sys/class/devfreq/17000000.gpu/max_freq\";"
    ));
    // On, the controller needs the cap files, under /sys.
    let on = orin.replacen("[board]", "[board]\ndvfs = true", 1);
    let bare = &on[..on.find("[dvfs]").unwrap()];
    assert_eq!(field_of(bare), "dvfs");
    let elsewhere = on.replace("/sys/class/devfreq/17000000.gpu/max_freq", "/etc/../sys/x");
    assert_eq!(field_of(&elsewhere), "dvfs.gpu_max_freq");
    // Off, the section is only documentation: no path is emitted.
    let off = parse_board(orin).unwrap();
    assert!(!off.dvfs && off.dvfs_gpu_max_freq.is_empty());
    // Unset means off.
    assert!(!parse_board(HOST).unwrap().dvfs);
}
