use super::*;

fn caps() -> PlanCaps {
    PlanCaps {
        lanes: 4,
        queue_depth: 64,
        dvfs: false,
    }
}

fn plan(lanes: u16, depth: u16, compute: u8) -> StreamPlan {
    StreamPlan {
        lanes,
        queue_depth: depth,
        compute_percent: compute,
        prefetch: 1,
        freq: None,
    }
}

fn sample() -> Lut {
    Lut::new(
        "host",
        vec![plan(4, 64, 100), plan(1, 8, 50), plan(2, 16, 100)],
        &[vec![100, 1000], vec![0, 5000]],
        &[vec![0, 1, 2], vec![2, 2, 1]],
        2,
        0.0,
    )
    .unwrap()
}

#[test]
fn state_quantizer_bins_by_edges() {
    let lut = sample();
    assert_eq!(lut.state(0, 0), 0);
    assert_eq!(lut.state(0, 99), 0);
    assert_eq!(lut.state(0, 100), 1);
    assert_eq!(lut.state(0, 999), 1);
    assert_eq!(lut.state(0, 1000), 2);
    assert_eq!(lut.state(0, u64::MAX), 2);
    // Layer 1's first edge is 0: nothing to read is already state 1.
    assert_eq!(lut.state(1, 0), 1);
    assert_eq!(lut.plan(0, 500), (1, &plan(1, 8, 50)));
    assert_eq!(lut.plan(1, 6000), (1, &plan(1, 8, 50)));
    assert_eq!(lut.plan(1, 10).0, 2);
}

#[test]
fn round_trips_through_the_table_format() {
    let lut = sample();
    let bytes = lut.encode(7);
    assert_eq!(Lut::decode(&bytes, 7).unwrap(), lut);
    lut.check_for("host", 2, caps()).unwrap();
}

#[test]
fn refuses_damage_mixups_and_other_versions_with_a_message() {
    let bytes = sample().encode(7);
    let err = |r: Result<Lut, LutError>| r.unwrap_err().to_string();
    for cut in [0, 3, 20, bytes.len() / 2, bytes.len() - 1] {
        let e = err(Lut::decode(&bytes[..cut], 7));
        assert!(e.contains("controller LUT"), "{e}");
    }
    let mut flipped = bytes.clone();
    let n = flipped.len();
    flipped[n - 3] ^= 0x10;
    assert!(err(Lut::decode(&flipped, 7)).contains("checksum"));
    assert!(err(Lut::decode(&bytes, 8)).contains("another model"));
    let mut other_version = bytes.clone();
    other_version[12..16].copy_from_slice(&(LUT_VERSION + 1).to_le_bytes());
    assert!(err(Lut::decode(&other_version, 7)).contains("version"));
    let thresholds = crate::tables::encode("thresh", 1, 7, &vec![1.0f32]);
    assert!(err(Lut::decode(&thresholds, 7)).contains("holds 'thresh'"));
    // A payload that passes the checksum but names a plan that does not exist.
    let bad = LutFile {
        board: "host".into(),
        layers: 1,
        states: 1,
        horizon: 1,
        energy_weight: 0.0,
        plans: vec![plan(1, 1, 100)],
        edges: vec![],
        entries: vec![3],
    };
    let bytes = crate::tables::encode(LUT_KIND, LUT_VERSION, 7, &bad);
    assert!(err(Lut::decode(&bytes, 7)).contains("names plan 3 of 1"));
}

#[test]
fn refuses_another_board_layer_count_or_plans_over_the_caps() {
    let lut = sample();
    let e = lut
        .check_for("jetson-agx-orin-64gb", 2, caps())
        .unwrap_err();
    assert!(e.to_string().contains("made for board 'host'"), "{e}");
    let e = lut.check_for("host", 30, caps()).unwrap_err();
    assert!(matches!(
        e,
        LutError::Layers {
            expected: 30,
            found: 2
        }
    ));
    let small = PlanCaps {
        lanes: 2,
        queue_depth: 64,
        dvfs: false,
    };
    let e = lut.check_for("host", 2, small).unwrap_err();
    assert!(matches!(e, LutError::Plan { index: 0, .. }), "{e}");
    assert!(e.to_string().contains("4 I/O lanes"));
}

#[test]
fn plans_are_caps_under_the_board() {
    assert!(plan(4, 64, 100).check(caps()).is_ok());
    assert_eq!(
        plan(0, 8, 100).check(caps()),
        Err(PlanError::Lanes { got: 0, max: 4 })
    );
    assert_eq!(
        plan(1, 65, 100).check(caps()),
        Err(PlanError::QueueDepth { got: 65, max: 64 })
    );
    assert_eq!(
        plan(1, 8, 0).check(caps()),
        Err(PlanError::ComputePercent(0))
    );
    let mut f = plan(1, 8, 100);
    f.freq = Some(FreqCap {
        gpu_mhz: 918,
        emc_mhz: 2133,
    });
    assert_eq!(f.check(caps()), Err(PlanError::NoDvfs));
    assert!(f
        .check(PlanCaps {
            dvfs: true,
            ..caps()
        })
        .is_ok());
    assert_eq!(plan(1, 8, 50).compute_units(2), 1);
    assert_eq!(plan(1, 8, 51).compute_units(2), 2);
    assert_eq!(plan(1, 8, 1).compute_units(16), 1);
    assert_eq!(plan(1, 8, 100).compute_units(132), 132);
    // The default is the board's own maxima, with clocks left alone.
    let d = StreamPlan::board_default();
    assert_eq!(d.check(PlanCaps::board()), Ok(()));
    assert_eq!(d.freq, None);
    assert_eq!("2:16:50%:1".parse::<StreamPlan>(), Ok(plan(2, 16, 50)));
    assert!("2:16:50".parse::<StreamPlan>().is_err());
    assert!("2:16:150:1".parse::<StreamPlan>().is_err());
}

#[test]
fn a_single_plan_is_every_layer_and_state() {
    let lut = Lut::single("host", plan(2, 8, 100), 3).unwrap();
    assert_eq!(lut.states(), 1);
    for l in 0..3 {
        assert_eq!(lut.plan(l, 0).1, &plan(2, 8, 100));
        assert_eq!(lut.plan(l, u64::MAX).0, 0);
    }
}

/// Two files standing in for a Jetson's cap files, holding `gpu` and `emc` Hz.
fn cap_files(name: &str, gpu: &str, emc: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("leanstream-clocks-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (g, e) = (dir.join("gpu_max_freq"), dir.join("emc_cap"));
    std::fs::write(&g, gpu).unwrap();
    std::fs::write(&e, emc).unwrap();
    (g, e)
}

fn hz(path: &std::path::Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn clocks_write_a_plans_cap_once_and_put_the_boot_caps_back() {
    let (g, e) = cap_files("apply", "1300500000\n", "3199000000\n");
    let cap = FreqCap {
        gpu_mhz: 612,
        emc_mhz: 2133,
    };
    {
        let mut c = Clocks::open(&g, &e).unwrap();
        assert_eq!(c.boot_hz(), (1_300_500_000, 3_199_000_000));
        assert_eq!(c.current(), None);
        c.apply(Some(cap)).unwrap();
        assert_eq!((hz(&g), hz(&e)), (612_000_000, 2_133_000_000));
        assert_eq!(c.current(), Some(cap));
        // The same cap again writes nothing (a value changed behind it stays).
        std::fs::write(&g, "7\n").unwrap();
        c.apply(Some(cap)).unwrap();
        assert_eq!(hz(&g), 7);
        // No cap: the boot caps.
        c.apply(None).unwrap();
        assert_eq!((hz(&g), hz(&e)), (1_300_500_000, 3_199_000_000));
        c.apply(Some(cap)).unwrap();
        assert_eq!(c.errors, 0);
    }
    // Dropped (the daemon stops): the boot caps back.
    assert_eq!((hz(&g), hz(&e)), (1_300_500_000, 3_199_000_000));
    let _ = std::fs::remove_dir_all(g.parent().unwrap());
}

#[test]
fn clocks_refuse_a_file_without_a_frequency_naming_it() {
    let (g, e) = cap_files("bad", "performance\n", "3199000000\n");
    let err = Clocks::open(&g, &e).err().expect("refused").to_string();
    assert!(
        err.contains("gpu_max_freq") && err.contains("not a frequency"),
        "{err}"
    );
    let missing = g.with_file_name("absent");
    let err = Clocks::open(&e, &missing)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("absent"), "{err}");
    // The board here has no dvfs: its clocks are never opened.
    assert!(Clocks::board().is_none());
    let _ = std::fs::remove_dir_all(g.parent().unwrap());
}
