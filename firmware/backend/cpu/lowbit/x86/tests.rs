use super::*;

/// The AVX2 kernel, and each VNNI form this CPU has, equal the scalar kernel bit for
/// bit for every format. A CPU without VNNI says so in a `skipped:` line.
#[test]
fn x86_kernels_equal_scalar() {
    if !(is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c"))
    {
        eprintln!("skipped: this CPU has no AVX2");
        return;
    }
    fn variants<const F: u8>() -> Vec<(&'static str, ChunkFn)> {
        let mut v: Vec<(&'static str, ChunkFn)> = vec![
            ("avx2", chunk::<F, VNNI_NONE>),
            ("avx2 row pairs", chunk_rowpair::<F, VNNI_NONE, false>),
            (
                "avx2 row pairs, prefetch",
                chunk_rowpair::<F, VNNI_NONE, true>,
            ),
        ];
        match vnni() {
            VNNI_VEX => v.extend([
                ("avx-vnni", chunk::<F, VNNI_VEX> as ChunkFn),
                ("avx-vnni row pairs", chunk_rowpair::<F, VNNI_VEX, false>),
            ]),
            VNNI_EVEX => v.extend([
                ("avx512-vnni", chunk::<F, VNNI_EVEX> as ChunkFn),
                (
                    "avx512-vnni row pairs",
                    chunk_rowpair::<F, VNNI_EVEX, false>,
                ),
            ]),
            _ => {}
        }
        // A CPU with both forms runs the EVEX one too.
        if vnni() == VNNI_VEX
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512vl")
        {
            v.push(("avx512-vnni", chunk::<F, VNNI_EVEX>));
        }
        v
    }
    check_format::<FMT_W8>(&variants::<FMT_W8>());
    check_format::<FMT_W4C>(&variants::<FMT_W4C>());
    check_format::<FMT_W4I>(&variants::<FMT_W4I>());
    check_format::<FMT_W4S>(&variants::<FMT_W4S>());
    // The swizzled packing's own eight-row kernels, under AVX2 and this CPU's VNNI.
    let mut swz: Vec<(&'static str, ChunkFn)> =
        vec![("avx2 swizzled", chunk_swizzled::<VNNI_NONE>)];
    match vnni() {
        VNNI_VEX => swz.push(("avx-vnni swizzled", chunk_swizzled::<VNNI_VEX>)),
        VNNI_EVEX => swz.push(("avx512-vnni swizzled", chunk_swizzled::<VNNI_EVEX>)),
        _ => {}
    }
    if has_avx512_vnni() {
        swz.push(("avx512 sixteen-row swizzled", chunk_swizzled16::<false>));
        swz.push((
            "avx512 sixteen-row swizzled, prefetch",
            chunk_swizzled16::<true>,
        ));
    } else {
        eprintln!("skipped: this CPU has no AVX-512 VNNI (sixteen-row swizzled kernel)");
    }
    check_format::<FMT_W4S>(&swz);
    if has_avx512_vnni() {
        check_many::<FMT_W4S>(chunk_swizzled::<VNNI_EVEX>, chunk_many_swizzled16);
        check_many::<FMT_W8>(chunk::<FMT_W8, VNNI_EVEX>, chunk_many16::<FMT_W8>);
        check_many::<FMT_W4C>(chunk::<FMT_W4C, VNNI_EVEX>, chunk_many16::<FMT_W4C>);
        check_many::<FMT_W4I>(chunk::<FMT_W4I, VNNI_EVEX>, chunk_many16::<FMT_W4I>);
    }
    // The many-input kernels under AVX2 and under the VNNI form this CPU has.
    fn many_all<const V: u8>() {
        check_many::<FMT_W8>(chunk::<FMT_W8, V>, chunk_many::<FMT_W8, V>);
        check_many::<FMT_W4C>(chunk::<FMT_W4C, V>, chunk_many::<FMT_W4C, V>);
        check_many::<FMT_W4I>(chunk::<FMT_W4I, V>, chunk_many::<FMT_W4I, V>);
        check_many::<FMT_W4S>(chunk::<FMT_W4S, V>, chunk_many::<FMT_W4S, V>);
        check_many::<FMT_W4S>(chunk_swizzled::<V>, chunk_many_swizzled::<V>);
    }
    many_all::<VNNI_NONE>();
    match vnni() {
        VNNI_VEX => many_all::<VNNI_VEX>(),
        VNNI_EVEX => many_all::<VNNI_EVEX>(),
        _ => {}
    }
    let names: Vec<&str> = variants::<FMT_W8>().iter().map(|v| v.0).collect();
    if names.len() == 1 {
        eprintln!("skipped: this CPU has no AVX-VNNI or AVX512-VNNI (AVX2 checked)");
    } else {
        eprintln!("x86 kernels checked against scalar: {names:?}");
    }
}
