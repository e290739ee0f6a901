use super::attend::dot;
use super::heads_per_task;
use super::*;

struct Bufs {
    k: Vec<i8>,
    v: Vec<i8>,
    ks: Vec<f32>,
    vs: Vec<f32>,
    kb: Vec<f32>,
    vb: Vec<f32>,
    kf: Vec<f32>,
    vf: Vec<f32>,
    kh: Vec<u16>,
    vh: Vec<u16>,
}

fn shape() -> Shape {
    Shape {
        n_layers: 2,
        kv_heads: 3,
        head_dim: 64,
        context: 300,
    }
}

fn bufs(s: &Shape) -> Bufs {
    Bufs {
        k: vec![0; s.i8_values()],
        v: vec![0; s.i8_values()],
        ks: vec![0.0; s.i8_scales()],
        vs: vec![0.0; s.i8_scales()],
        kb: vec![0.0; s.kv_dim()],
        vb: vec![0.0; s.kv_dim()],
        kf: vec![0.0; s.n_layers * s.context * s.kv_dim()],
        vf: vec![0.0; s.n_layers * s.context * s.kv_dim()],
        kh: vec![0; s.n_layers * s.context * s.kv_dim()],
        vh: vec![0; s.n_layers * s.context * s.kv_dim()],
    }
}

fn cache<'a>(s: Shape, b: &'a mut Bufs, policy: Policy) -> KvCache<'a> {
    KvCache::new(
        s,
        Storage::I8 {
            k: &mut b.k,
            v: &mut b.v,
            ks: &mut b.ks,
            vs: &mut b.vs,
            kbuf: &mut b.kb,
            vbuf: &mut b.vb,
        },
        policy,
    )
}

/// The f32 cache over the same shape.
fn cache_f32<'a>(s: Shape, b: &'a mut Bufs, policy: Policy) -> KvCache<'a> {
    KvCache::new(
        s,
        Storage::F32 {
            k: &mut b.kf,
            v: &mut b.vf,
            kbuf: &mut b.kb,
            vbuf: &mut b.vb,
        },
        policy,
    )
}

/// The f16 cache over the same shape.
fn cache_f16<'a>(s: Shape, b: &'a mut Bufs) -> KvCache<'a> {
    KvCache::new(
        s,
        Storage::F16 {
            k: &mut b.kh,
            v: &mut b.vh,
            kbuf: &mut b.kb,
            vbuf: &mut b.vb,
        },
        Policy::Fixed(Layout::TokenMajor),
    )
}

/// Deterministic K/V/q values for (layer, position, index).
fn val(l: usize, pos: usize, i: usize, salt: u64) -> f32 {
    let mut x = (l as u64) << 40 ^ (pos as u64) << 20 ^ i as u64 ^ salt.wrapping_mul(0x9E37_79B9);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

fn append(c: &mut KvCache, pos: usize) {
    append_with(c, pos, |x| x)
}

/// `append` with each key and value passed through `f` first.
fn append_with(c: &mut KvCache, pos: usize, f: impl Fn(f32) -> f32) {
    c.begin_token(pos);
    for l in 0..c.shape.n_layers {
        let (k, v) = c.rows();
        for (i, x) in k.iter_mut().enumerate() {
            *x = f(val(l, pos, i, 1));
        }
        for (i, x) in v.iter_mut().enumerate() {
            *x = f(val(l, pos, i, 2));
        }
        c.commit(l, pos);
    }
}

fn attention(c: &KvCache, pos: usize) -> Vec<f32> {
    let s = c.shape;
    let mut all = Vec::new();
    for l in 0..s.n_layers {
        for h in 0..s.kv_heads {
            let q: Vec<f32> = (0..s.head_dim)
                .map(|i| val(l, pos, i, 3 + h as u64))
                .collect();
            let mut att = vec![0f32; pos + 1];
            let mut out = vec![0f32; s.head_dim];
            c.attend(l, h, &q, pos, &mut att, &mut out);
            all.extend(out);
        }
    }
    all
}

/// A cost model that switches to head tiles after a few tokens.
fn eager() -> CostModel {
    CostModel {
        persist: 4,
        margin: 0.0,
        ..CostModel::default()
    }
}

#[test]
fn mixed_segments_equal_single_layout_exactly() {
    let s = shape();
    let (mut b1, mut b2, mut b3) = (bufs(&s), bufs(&s), bufs(&s));
    let mut mixed = cache(s, &mut b1, Policy::Adaptive(eager()));
    let mut tok = cache(s, &mut b2, Policy::Fixed(Layout::TokenMajor));
    let mut tiles = cache(s, &mut b3, Policy::Fixed(Layout::HeadTiles));
    for pos in 0..s.context {
        append(&mut mixed, pos);
        append(&mut tok, pos);
        append(&mut tiles, pos);
        if pos % 37 == 0 || pos + 1 == s.context {
            let want = attention(&tok, pos);
            assert_eq!(attention(&mixed, pos), want, "mixed chain at {pos}");
            assert_eq!(attention(&tiles, pos), want, "head tiles at {pos}");
        }
    }
    let segs = mixed.segments();
    assert!(segs.len() >= 2, "the model never switched: {segs:?}");
    assert_eq!(segs[0].layout, Layout::TokenMajor);
    assert_eq!(segs[1].layout, Layout::HeadTiles);
    assert_eq!(tok.segments().len(), 1);
}

#[test]
fn old_segments_are_never_relaid_and_rewinds_truncate() {
    let s = shape();
    let (mut b1, mut b2) = (bufs(&s), bufs(&s));
    let mut mixed = cache(s, &mut b1, Policy::Adaptive(eager()));
    let mut tok = cache(s, &mut b2, Policy::Fixed(Layout::TokenMajor));
    let mut first: Option<Segment> = None;
    for pos in 0..200 {
        append(&mut mixed, pos);
        append(&mut tok, pos);
        let segs = mixed.segments();
        if segs.len() >= 2 {
            let f = *first.get_or_insert(segs[0]);
            assert_eq!(segs[0], f, "a closed segment changed");
        }
    }
    // Rewind to 10 (inside the first segment) and write new tokens there: same as the reference.
    for pos in 10..150 {
        append(&mut mixed, pos);
        append(&mut tok, pos);
    }
    assert_eq!(attention(&mixed, 149), attention(&tok, 149));
    // Rewind to 0 forgets everything.
    append(&mut mixed, 0);
    assert_eq!(mixed.segments().len(), 1);
    assert_eq!(mixed.segments()[0].len, 1);
}

#[test]
fn int8_attention_is_close_to_f32() {
    let s = shape();
    let mut b = bufs(&s);
    let mut c8 = cache(s, &mut b, Policy::Adaptive(eager()));
    let mut b32 = bufs(&s);
    let mut c32 = cache_f32(s, &mut b32, Policy::Adaptive(eager()));
    for pos in 0..200 {
        append(&mut c8, pos);
        append(&mut c32, pos);
    }
    let (a, b) = (attention(&c8, 199), attention(&c32, 199));
    let err = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let mag = b.iter().map(|x| x.abs()).fold(0f32, f32::max);
    assert!(
        err < 0.02 * mag.max(0.05),
        "int8 attention off by {err} (magnitude {mag})"
    );
    assert_eq!(c32.segments().len(), 1);
}

/// The AVX2 build of attention equals the baseline build bit for bit, f32 and int8 caches,
/// over a chain of mixed segments.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_attention_equals_baseline_exactly() {
    if !cpu_has_avx2() {
        eprintln!("skipped: this CPU has no AVX2");
        return;
    }
    let s = shape();
    let mut b = bufs(&s);
    let mut c8 = cache(s, &mut b, Policy::Adaptive(eager()));
    let mut b32 = bufs(&s);
    let mut c32 = cache_f32(s, &mut b32, Policy::Adaptive(eager()));
    for pos in 0..150 {
        append(&mut c8, pos);
        append(&mut c32, pos);
    }
    assert!(c8.segments().len() > 1, "a chain of mixed segments");
    for c in [&c8, &c32] {
        for pos in [0, 37, 149] {
            for (l, h) in [(0, 0), (1, 2)] {
                let q: Vec<f32> = (0..s.head_dim).map(|i| val(l, pos, i, 7)).collect();
                let (mut a1, mut a2) = (vec![0f32; pos + 1], vec![0f32; pos + 1]);
                let (mut o1, mut o2) = (vec![0f32; s.head_dim], vec![0f32; s.head_dim]);
                c.attend_any(l, h, &q, pos, &mut a1, 0, &mut o1);
                // SAFETY: cpu_has_avx2() found AVX2, FMA and F16C.
                unsafe { c.attend_avx2(l, h, &q, pos, &mut a2, 0, &mut o2) };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&o1), bits(&o2), "pos {pos} layer {l} head {h}");
                assert_eq!(bits(&a1), bits(&a2));
            }
        }
    }
}

/// Outlier K channels (a bias of 150 on one rope pair, as qwen2's first layers have): the
/// scales from the bias bring the int8 cache's attention back close to the f32 one.
#[test]
fn key_scales_tame_outlier_channels() {
    let s = Shape {
        n_layers: 1,
        kv_heads: 1,
        head_dim: 64,
        context: 64,
    };
    let mut bias = vec![0f32; 64];
    for (i, b) in bias.iter_mut().enumerate() {
        *b = 0.5 + (i % 7) as f32 * 0.1;
    }
    (bias[5], bias[37]) = (150.0, -120.0);
    let mut scales = vec![0f32; 64];
    key_scales_from_bias(&bias, 64, |i| (i, i + 32), &mut scales);
    assert!(scales[5] > 20.0 && scales[5] == scales[37], "{scales:?}");
    assert!(scales
        .iter()
        .enumerate()
        .all(|(i, &f)| i == 5 || i == 37 || f == 1.0));

    let run = |scaled: bool, int8: bool| -> Vec<f32> {
        let mut b = bufs(&s);
        let policy = Policy::Fixed(Layout::TokenMajor);
        let mut c = if int8 {
            cache(s, &mut b, policy)
        } else {
            cache_f32(s, &mut b, policy)
        };
        if scaled {
            c.scale_keys(&scales);
        }
        for pos in 0..40 {
            c.begin_token(pos);
            let (k, v) = c.rows();
            for (i, x) in k.iter_mut().enumerate() {
                *x = 2.0 * val(0, pos, i, 1) + bias[i];
            }
            for (i, x) in v.iter_mut().enumerate() {
                *x = val(0, pos, i, 2);
            }
            c.commit(0, pos);
        }
        let q: Vec<f32> = (0..64).map(|i| val(0, 39, i, 3)).collect();
        let (mut att, mut out) = (vec![0f32; 40], vec![0f32; 64]);
        c.attend(0, 0, &q, 39, &mut att, &mut out);
        att
    };
    let exact = run(false, false);
    let err = |a: &[f32]| {
        a.iter()
            .zip(&exact)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    let (plain, scaled) = (err(&run(false, true)), err(&run(true, true)));
    assert!(
        scaled < 0.25 * plain,
        "attention weights off by {plain} unscaled, {scaled} scaled"
    );
}

#[test]
fn cost_model_prefers_token_major_short_and_tiles_long() {
    let s = Shape {
        n_layers: 30,
        kv_heads: 3,
        head_dim: 64,
        context: 4096,
    };
    let m = CostModel::default();
    assert_eq!(m.best(&s, 1), Layout::TokenMajor);
    assert_eq!(m.best(&s, 4096), Layout::HeadTiles);
    assert!(m.check().is_ok());
    let bad = CostModel {
        bandwidth: 0.0,
        ..m
    };
    let e = bad.check().unwrap_err();
    assert!(
        matches!(e, KvError::InvalidConstants { path: None, constants } if constants == bad),
        "{e}"
    );
    assert!(e.to_string().contains("invalid"), "{e}");
}

#[test]
fn kvcost_table_round_trips_and_refuses_damage() {
    let m = CostModel::default();
    let bytes = crate::tables::encode(TABLE_KIND, TABLE_VERSION, 9, &m);
    let back: CostModel = crate::tables::decode(&bytes, TABLE_KIND, TABLE_VERSION, 9).unwrap();
    assert_eq!(back, m);
    let mut bad = bytes.clone();
    let n = bad.len();
    bad[n - 3] ^= 0x40;
    let e = crate::tables::decode::<CostModel>(&bad, TABLE_KIND, TABLE_VERSION, 9).unwrap_err();
    assert!(e.to_string().contains("damaged"), "{e}");
}

/// One KV rule for both backends: int8 for whole groups of 32 per head, at most the backend's
/// widest head, only at the int8 precisions; f16 otherwise; f16 or f32 whenever asked.
#[test]
fn kv_precision_rule() {
    use crate::quant::Precision;
    use KvPrecision::*;
    let rule = |p, c, hd, max| kv_precision(p, c, hd, max);
    let auto = KvChoice::Auto;
    for p in [Precision::W8a8, Precision::W4a8] {
        assert_eq!(rule(p, auto, 64, MAX_HEAD_DIM), I8);
        assert_eq!(rule(p, auto, 256, MAX_HEAD_DIM), I8);
        assert_eq!(
            rule(p, auto, 256, 128),
            F16,
            "wider than the backend's int8 head"
        );
        assert_eq!(rule(p, auto, 128, 128), I8);
        assert_eq!(rule(p, auto, 48, MAX_HEAD_DIM), F16, "not whole groups");
        assert_eq!(
            rule(p, auto, 512, 1024),
            F16,
            "wider than the CPU's int8 head"
        );
        assert_eq!(rule(p, KvChoice::F32, 64, MAX_HEAD_DIM), F32);
        assert_eq!(rule(p, KvChoice::F16, 64, MAX_HEAD_DIM), F16);
    }
    for p in [Precision::Native, Precision::F16] {
        assert_eq!(rule(p, auto, 64, MAX_HEAD_DIM), F16);
        assert_eq!(rule(p, KvChoice::F32, 64, MAX_HEAD_DIM), F32);
    }
    for k in [F32, F16, I8] {
        assert_eq!(rule(Precision::W8a8, k.choice(), 64, MAX_HEAD_DIM), k);
    }
}

/// The f16 cache stores each value rounded to the nearest half and attends over them with the
/// f32 cache's arithmetic: its results are, bit for bit, the f32 cache's over the rounded
/// values, in the baseline and AVX2 builds, one query head or several, at heads of 48 (all past
/// the value blocks), 64 and 128 (whole blocks), short of and past a score block.
#[test]
fn f16_attention_equals_f32_over_rounded_values_exactly() {
    use crate::model::ggml::{f16_to_f32, f32_to_f16};
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let round = |x: f32| f16_to_f32(f32_to_f16(x));
    for head_dim in [48, 64, 128] {
        let s = Shape {
            n_layers: 2,
            kv_heads: 2,
            head_dim,
            context: 80,
        };
        let (mut b16, mut b32) = (bufs(&s), bufs(&s));
        let mut c16 = cache_f16(s, &mut b16);
        let mut c32 = cache_f32(s, &mut b32, Policy::Fixed(Layout::TokenMajor));
        for pos in 0..80 {
            append(&mut c16, pos);
            append_with(&mut c32, pos, round);
        }
        assert_eq!(c16.precision(), KvPrecision::F16);
        for avx2 in [false, cpu_has_avx2()] {
            c16.set_avx2(avx2);
            c32.set_avx2(avx2);
            for (pos, n, l, kvh) in [(0, 1, 0, 0), (6, 3, 1, 1), (8, 2, 0, 1), (79, 6, 1, 0)] {
                let qs: Vec<f32> = (0..n * head_dim).map(|i| val(l, pos, i, 13)).collect();
                let stride = pos + 3;
                let (mut a16, mut a32) = (vec![0f32; n * stride], vec![0f32; n * stride]);
                let (mut o16, mut o32) = (vec![0f32; n * head_dim], vec![0f32; n * head_dim]);
                c16.attend_heads(l, kvh, &qs, pos, &mut a16, stride, &mut o16);
                c32.attend_heads(l, kvh, &qs, pos, &mut a32, stride, &mut o32);
                let what = format!("head {head_dim} avx2 {avx2} pos {pos} heads {n}");
                assert_eq!(bits(&o16), bits(&o32), "{what}");
                assert_eq!(bits(&a16), bits(&a32), "{what}");
                assert!(o16.iter().any(|x| *x != 0.0), "{what}: an output");
            }
        }
        // Rounding did change values: the f16 cache is not the f32 cache of the raw values.
        let mut b_raw = bufs(&s);
        let mut raw = cache_f32(s, &mut b_raw, Policy::Fixed(Layout::TokenMajor));
        for pos in 0..80 {
            append(&mut raw, pos);
        }
        assert_ne!(attention(&raw, 79), attention(&c16, 79), "head {head_dim}");
    }
}

/// `policy_from` says which part of the request is wrong: the layout's name, the table file
/// (kept as its source), or the constants inside a table that reads.
#[test]
fn policy_refusals_say_what_is_wrong() {
    let model = crate::model::ModelFile::from_bytes(
        crate::model::tests::tiny("llama", false, true).build(),
    )
    .unwrap();
    assert!(matches!(
        policy_from(&model, None, "diagonal"),
        Err(KvError::UnknownLayout(l)) if l == "diagonal"
    ));
    assert!(matches!(
        policy_from(&model, None, "head-tiles"),
        Ok(Policy::Fixed(Layout::HeadTiles))
    ));

    let dir = std::env::temp_dir().join(format!("leanstream-kvcost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let id = crate::tables::model_identity(&model);
    let other = dir.join("other.kvcost");
    crate::tables::write(
        &other,
        TABLE_KIND,
        TABLE_VERSION,
        id ^ 1,
        &CostModel::default(),
    )
    .unwrap();
    let e = policy_from(&model, Some(&other), "adaptive").unwrap_err();
    assert!(
        matches!(
            &e,
            KvError::Table {
                source: crate::tables::TableError::OtherModel { .. },
                ..
            }
        ),
        "{e}"
    );
    assert!(std::error::Error::source(&e).is_some());

    let invalid = dir.join("invalid.kvcost");
    let negative = CostModel {
        alpha1: -1.0,
        ..CostModel::default()
    };
    crate::tables::write(&invalid, TABLE_KIND, TABLE_VERSION, id, &negative).unwrap();
    let e = policy_from(&model, Some(&invalid), "adaptive").unwrap_err();
    assert!(
        matches!(&e, KvError::InvalidConstants { path: Some(p), constants } if p == &invalid && *constants == negative),
        "{e}"
    );
    assert!(
        e.to_string().starts_with(&format!(
            "{}: kvcost table holds invalid constants",
            invalid.display()
        )),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The f32 cache's attention equals the textbook loop bit for bit (scores by `dot`, softmax,
/// then each output the sum of weighted values in position order) at a head size of 48: one
/// block of 32 outputs kept in registers, then 16 past the blocks.
#[test]
fn f32_attention_equals_the_plain_loop_exactly() {
    let s = Shape {
        n_layers: 1,
        kv_heads: 2,
        head_dim: 48,
        context: 90,
    };
    let mut b = bufs(&s);
    let mut c = cache_f32(s, &mut b, Policy::Fixed(Layout::TokenMajor));
    for pos in 0..90 {
        append(&mut c, pos);
    }
    let hd = s.head_dim;
    for avx2 in [false, true] {
        c.set_avx2(avx2);
        for (pos, h) in [(0, 0), (41, 1), (89, 0)] {
            let q: Vec<f32> = (0..hd).map(|i| val(0, pos, i, 9)).collect();
            let mut att = vec![0f32; pos + 1];
            let mut out = vec![0f32; hd];
            c.attend(0, h, &q, pos, &mut att, &mut out);
            let key = |t: usize| {
                (0..hd)
                    .map(|i| val(0, t, h * hd + i, 1))
                    .collect::<Vec<_>>()
            };
            let scale = 1.0 / (hd as f32).sqrt();
            let mut want_att: Vec<f32> = (0..=pos).map(|t| dot(&q, &key(t)) * scale).collect();
            crate::ops::softmax(&mut want_att);
            let mut want = vec![0f32; hd];
            for (t, &a) in want_att.iter().enumerate() {
                for (i, o) in want.iter_mut().enumerate() {
                    *o += a * val(0, t, h * hd + i, 2);
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&att),
                bits(&want_att),
                "avx2 {avx2} pos {pos} head {h}"
            );
            assert_eq!(bits(&out), bits(&want), "avx2 {avx2} pos {pos} head {h}");
        }
    }
}

/// The int8 cache's attention equals the plain loop bit for bit (each group's exact integer
/// dot scaled and added group by group, softmax, then each output the sum of weighted values in
/// position order), over a chain of mixed segments, baseline and AVX2 builds, positions short
/// of, at and past a value tile.
#[test]
fn int8_attention_equals_the_plain_loop_exactly() {
    let s = shape();
    let mut b = bufs(&s);
    let mut c = cache(s, &mut b, Policy::Adaptive(eager()));
    for pos in 0..200 {
        append(&mut c, pos);
    }
    assert!(c.segments().len() > 1, "a chain of mixed segments");
    let (hd, ng) = (s.head_dim, s.groups());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for avx2 in [false, cpu_has_avx2()] {
        c.set_avx2(avx2);
        for (pos, l, h) in [(0, 0, 0), (15, 1, 2), (16, 0, 1), (199, 1, 0)] {
            let q: Vec<f32> = (0..hd).map(|i| val(l, pos, i, 13)).collect();
            let mut att = vec![0f32; pos + 1];
            let mut out = vec![0f32; hd];
            c.attend(l, h, &q, pos, &mut att, &mut out);
            let Storage::I8 { k, v, ks, vs, .. } = &c.store else {
                unreachable!("an int8 cache")
            };
            let (mut qq, mut dq) = (vec![0i8; hd], vec![0f32; ng]);
            layout::quantize_head(&q, &mut qq, &mut dq);
            let rows: Vec<(usize, usize, usize)> = c
                .segments()
                .iter()
                .flat_map(|seg| {
                    let n = seg.len.min((pos + 1).saturating_sub(seg.start));
                    (0..n).map(move |i| {
                        let (d, sc) = layout::addr(&s, seg, l, h, i);
                        (seg.start + i, d, sc)
                    })
                })
                .collect();
            let scale = 1.0 / (hd as f32).sqrt();
            let mut want_att = vec![0f32; pos + 1];
            for &(t, d, sc) in &rows {
                let mut acc = 0f32;
                for g in 0..ng {
                    let dot: i32 = (0..GROUP)
                        .map(|j| qq[g * GROUP + j] as i32 * k[d + g * GROUP + j] as i32)
                        .sum();
                    acc += (dq[g] * ks[sc + g]) * dot as f32;
                }
                want_att[t] = acc * scale;
            }
            crate::ops::softmax(&mut want_att);
            let mut want = vec![0f32; hd];
            for &(t, d, sc) in &rows {
                for g in 0..ng {
                    let w = want_att[t] * vs[sc + g];
                    for j in 0..GROUP {
                        want[g * GROUP + j] += w * v[d + g * GROUP + j] as f32;
                    }
                }
            }
            let what = format!("avx2 {avx2} pos {pos} layer {l} head {h}");
            assert_eq!(bits(&att), bits(&want_att), "{what}");
            assert_eq!(bits(&out), bits(&want), "{what}");
        }
    }
}

/// Several query heads of a KV head at once (`attend_heads`: each row read once for them all,
/// values a tile of positions at a time) give each head the bits `attend` gives it alone: f32
/// cache at a head size of 48 (a block of 32 and 16 past it) and the int8 chain of mixed
/// segments, baseline and AVX2 builds, positions short of, at and past a value tile.
#[test]
fn heads_together_equal_heads_alone_exactly() {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let s48 = Shape {
        n_layers: 2,
        kv_heads: 2,
        head_dim: 48,
        context: 300,
    };
    let (mut b32, mut b8) = (bufs(&s48), bufs(&shape()));
    let mut c32 = cache_f32(s48, &mut b32, Policy::Fixed(Layout::TokenMajor));
    let mut c8 = cache(shape(), &mut b8, Policy::Adaptive(eager()));
    for pos in 0..200 {
        append(&mut c32, pos);
        append(&mut c8, pos);
    }
    assert!(c8.segments().len() > 1, "a chain of mixed segments");
    for c in [&mut c32, &mut c8] {
        let s = c.shape;
        let hd = s.head_dim;
        for avx2 in [false, cpu_has_avx2()] {
            c.set_avx2(avx2);
            for (pos, n, l, kvh) in [(0, 3, 0, 0), (63, 2, 1, 1), (64, 5, 0, 1), (199, 6, 1, 0)] {
                let stride = pos + 7;
                let qs: Vec<f32> = (0..n * hd).map(|i| val(l, pos, i, 11)).collect();
                let mut att = vec![f32::NAN; n * stride];
                let mut out = vec![f32::NAN; n * hd];
                c.attend_heads(l, kvh, &qs, pos, &mut att, stride, &mut out);
                for h in 0..n {
                    let mut a1 = vec![0f32; pos + 1];
                    let mut o1 = vec![0f32; hd];
                    c.attend(l, kvh, &qs[h * hd..][..hd], pos, &mut a1, &mut o1);
                    let what = format!("{:?} avx2 {avx2} pos {pos} head {h} of {n}", s);
                    assert_eq!(bits(&out[h * hd..][..hd]), bits(&o1), "{what}");
                    assert_eq!(bits(&att[h * stride..][..pos + 1]), bits(&a1), "{what}");
                    assert!(o1.iter().any(|x| *x != 0.0), "{what}: an output");
                }
            }
        }
    }
}

/// Heads that are not whole, or weights that would overlap, are a caller's fault.
#[test]
#[should_panic(expected = "each head's weights need 11 places, 10 apart")]
fn heads_together_need_room_for_every_head() {
    let s = shape();
    let mut b = bufs(&s);
    let mut c = cache_f32(s, &mut b, Policy::Fixed(Layout::TokenMajor));
    for pos in 0..11 {
        append(&mut c, pos);
    }
    let qs = vec![0.5f32; 2 * s.head_dim];
    let (mut att, mut out) = (vec![0f32; 20], vec![0f32; 2 * s.head_dim]);
    c.attend_heads(0, 0, &qs, 10, &mut att, 10, &mut out);
}

/// Attention tasks: the least time on the busiest thread, a head of a bigger task costing
/// less (it shares the reading of the rows).
#[test]
fn heads_per_task_keeps_threads_busy_and_reads_rows_once() {
    // Qwen2.5-1.5B: 12 query heads on 2 KV heads.
    assert_eq!(heads_per_task(6, 2, 2), 6);
    assert_eq!(heads_per_task(6, 2, 8), 2);
    assert_eq!(heads_per_task(6, 2, 16), 1);
    // SmolLM2-135M: 9 on 3. Three tasks of three on two threads: 6 heads at 4/3 against 5
    // alone at 2.
    assert_eq!(heads_per_task(3, 3, 2), 3);
    assert_eq!(heads_per_task(3, 3, 8), 3);
    assert_eq!(heads_per_task(3, 3, 16), 1);
    // A prefill batch of 16 tokens has work enough for whole groups.
    assert_eq!(heads_per_task(3, 48, 2), 3);
    assert_eq!(heads_per_task(6, 32, 8), 6);
    // No grouping (multi-head attention), one thread.
    assert_eq!(heads_per_task(1, 12, 2), 1);
    assert_eq!(heads_per_task(6, 2, 1), 6);
}
