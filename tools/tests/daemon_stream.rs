//! leanstreamd serving a flash image whose FFN streams from disk (SmolLM2-135M; skipped
//! visibly when absent): its greedy text is the in-memory oracle's with the same neurons,
//! /metrics exports the streamed FFN's figures and no heap allocation after boot, and an image
//! truncated under the daemon ends the requests that need the lost blocks with a clear error
//! while the daemon keeps serving (and serves whole answers again once the file is whole).

mod common;

use common::daemon::{cli_greedy_with, json_string_field, sse_text, Daemon};
use leanstream::model::flash::FlashImage;
use leanstream::quant::Precision;
use leanstream_tools::offline::flash::{write_image, BoardTarget, FlashOptions};
use leanstream_tools::offline::placement::{Active, PlacementKind};

/// The value of a metric line `name value` (floats too).
fn gauge(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{metrics}"))
}

#[test]
fn streamed_daemon_serves_the_oracles_text_and_survives_a_truncated_image() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("leanstream-dstream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let whole = dir.join("whole.flash");
    let served = dir.join("served.flash");
    let o = FlashOptions {
        board: BoardTarget::load("host").unwrap(),
        precision: Precision::Native,
        placement: PlacementKind::Identity,
        thresholds: Some(common::repo_root().join("tables/SmolLM2-135M-Instruct.Q4_1.thresh")),
        trace: None,
        eval_trace: None,
        active: Active::TopK { keep: 0.2 },
        block_units: 1,
        run_blocks: None,
    };
    write_image(&model, &whole, &o, &mut |_, _| {}).unwrap();
    std::fs::copy(&whole, &served).unwrap();

    let prompt = "The capital of France is";
    let sparse = ["--ffn", "oracle", "--sparsity", "0.5"];
    let mut memory = sparse.to_vec();
    memory.extend(["--bundle-down", "q8"]);
    let expected = cli_greedy_with(&model, None, prompt, 24, &memory);
    let mut flags = sparse.to_vec();
    flags.extend(["--ffn-budget", "25%", "--cache", "lfu"]);
    let d = Daemon::start(&served, None, "stream", &flags);
    let body = format!(r#"{{"prompt":"{prompt}","max_tokens":24,"temperature":0}}"#);
    let r = d.post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.field("text").unwrap(), expected);
    let m = d.get("/metrics").body;
    assert!(gauge(&m, "leanstream_ffn_tokens_total") >= 24.0, "{m}");
    let hit = gauge(&m, "leanstream_ffn_cache_hit_ratio");
    assert!(hit > 0.0 && hit < 1.0, "{m}");
    assert!(
        gauge(&m, "leanstream_ffn_bytes_read_per_token") > 4096.0,
        "{m}"
    );
    assert!(
        gauge(&m, "leanstream_ffn_io_wait_seconds_per_token") > 0.0,
        "{m}"
    );
    assert_eq!(
        gauge(&m, "leanstream_heap_allocations_after_boot_total"),
        0.0,
        "{m}"
    );

    // The last layer's blocks are gone from the file: a 25% cache cannot hold them all, so the
    // next answers need reads past the end.
    let img = FlashImage::open(&whole).unwrap();
    let (last_layer, _) = img.block_extent(img.layers() - 1, 0);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&served)
        .unwrap()
        .set_len(last_layer)
        .unwrap();
    let r = d.post("/v1/completions", &body);
    assert!(
        r.body.contains("\"finish_reason\":\"error\"")
            && r.field("message")
                .is_some_and(|m| m.contains("the FFN stream from the flash image failed")
                    && m.contains("truncated")),
        "{r:?}"
    );
    let streamed = body.replace("\"temperature\":0", "\"temperature\":0,\"stream\":true");
    let r = d.post("/v1/completions", &streamed);
    let (_, done) = sse_text(&r.body, "text");
    assert!(
        done && r.body.contains("\"finish_reason\":\"error\"")
            && r.body.lines().any(|l| l.starts_with("data: {\"error\":")
                && json_string_field(l, "message").is_some_and(|m| m.contains("truncated"))),
        "{r:?}"
    );
    assert_eq!(d.get("/health").status, 200);
    assert_eq!(d.post("/v1/completions", "{bad").status, 400);

    // Whole again (the same file, rewritten in place): whole answers again.
    std::fs::copy(&whole, &served).unwrap();
    let r = d.post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.contains("\"finish_reason\":\"length\""), "{r:?}");
    assert_eq!(r.field("text").unwrap(), expected);
    let m = d.get("/metrics").body;
    assert_eq!(
        gauge(&m, "leanstream_heap_allocations_after_boot_total"),
        0.0,
        "{m}"
    );
    assert!(
        gauge(&m, "leanstream_requests_total{status=\"500\"}") >= 2.0,
        "{m}"
    );
    assert_eq!(d.stop(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}
