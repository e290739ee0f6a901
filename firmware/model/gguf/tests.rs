use super::build::Builder;
use super::*;

fn sample() -> Builder {
    let mut b = Builder::default();
    b.kv_str("general.architecture", "llama")
        .kv_u32("llama.block_count", 2)
        .kv_f32("llama.rope.freq_base", 10000.0)
        .kv_raw("flag", T_BOOL, vec![1])
        .kv_raw("u64", T_U64, 7u64.to_le_bytes().to_vec())
        .kv_raw("neg", T_I32, (-3i32).to_le_bytes().to_vec())
        .kv_raw("f64", T_F64, 0.5f64.to_le_bytes().to_vec())
        .kv_str_array("tokenizer.ggml.tokens", &["a", "bc", ""])
        .kv_f32_array("tokenizer.ggml.scores", &[0.0, -1.5])
        .kv_i32_array("tokenizer.ggml.token_type", &[1, 2, 3]);
    b.tensor_f32(
        "a.weight",
        &[4, 2],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
    );
    b.tensor("q.weight", &[32, 1], GgmlType::Q8_0, (0..34).collect());
    b
}

#[test]
fn metadata_reencodes_to_the_same_values() {
    let g = Gguf::from_bytes(sample().build()).unwrap();
    let mut b = Builder::default();
    for (k, v) in g.metadata() {
        let (ty, bytes) = v.encode();
        b.kv_raw(k, ty, bytes);
    }
    // Nested arrays and every scalar type, which sample() does not hold.
    let nested = Value::Array(Array::Nested(vec![
        Array::U8(vec![1, 2]),
        Array::Bool(vec![true, false]),
        Array::F64(vec![-0.25]),
        Array::Str(vec!["x".into()]),
    ]));
    let scalars = [
        Value::U8(7),
        Value::I8(-7),
        Value::U16(700),
        Value::I16(-700),
        Value::I64(-1 << 40),
        Value::Bool(false),
        nested.clone(),
    ];
    for (i, v) in scalars.iter().enumerate() {
        let (ty, bytes) = v.encode();
        b.kv_raw(&format!("extra.{i}"), ty, bytes);
    }
    let again = Gguf::from_bytes(b.build()).unwrap();
    assert_eq!(&again.metadata()[..g.metadata().len()], g.metadata());
    for (i, v) in scalars.iter().enumerate() {
        assert_eq!(again.get(&format!("extra.{i}")), Some(v));
    }
}

/// A GGUF held inside another file from a page on parses in place; a range past the
/// file's end is a truncation.
#[test]
fn opens_a_range_of_a_file() {
    let mut b = Builder::default();
    b.kv_str("general.architecture", "llama")
        .tensor_f32("t", &[2], &[1.0, 2.0]);
    let gguf = b.build();
    let mut file = vec![7u8; 4096];
    file.extend_from_slice(&gguf);
    file.extend_from_slice(b"trailing bytes");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("outer.bin");
    std::fs::write(&path, &file).unwrap();
    let g = Gguf::open_range(&path, 4096, gguf.len()).unwrap();
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(
        g.tensor_data(g.tensor("t").unwrap()),
        &gguf[gguf.len() - 8..]
    );
    let e = Gguf::open_range(&path, 4096, file.len()).unwrap_err();
    assert!(matches!(e, FormatError::Truncated { .. }), "{e}");
}

#[test]
fn parses_valid_file() {
    let g = Gguf::from_bytes(sample().build()).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 32);
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(g.get_u32("llama.block_count"), Some(2));
    assert_eq!(g.get_u32("u64"), Some(7));
    assert_eq!(g.get_u32("neg"), None);
    assert_eq!(g.get_f32("llama.rope.freq_base"), Some(10000.0));
    assert_eq!(g.get_f32("f64"), Some(0.5));
    assert_eq!(g.get_bool("flag"), Some(true));
    assert_eq!(
        g.get_str_array("tokenizer.ggml.tokens").unwrap(),
        &["a", "bc", ""]
    );
    assert_eq!(
        g.get_f32_array("tokenizer.ggml.scores").unwrap(),
        &[0.0, -1.5]
    );
    assert_eq!(
        g.get_i32_array("tokenizer.ggml.token_type").unwrap(),
        &[1, 2, 3]
    );
    assert_eq!(g.get_str("missing"), None);
    let t = g.tensor("a.weight").unwrap();
    assert_eq!(t.dims, vec![4, 2]);
    assert_eq!(t.n_bytes, 32);
    assert_eq!(t.offset % 32, 0);
    let d = g.tensor_data(t);
    assert_eq!(f32::from_le_bytes(d[28..32].try_into().unwrap()), 8.0);
    let q = g.tensor("q.weight").unwrap();
    assert_eq!(g.tensor_data(q), (0..34).collect::<Vec<u8>>());
    assert_eq!(q.offset + q.n_bytes, g.bytes().len());
    // A foreign TensorInfo pointing outside yields an empty slice, not a panic.
    let bogus = TensorInfo {
        offset: usize::MAX,
        n_bytes: 10,
        ..t.clone()
    };
    assert!(g.tensor_data(&bogus).is_empty());
}

fn err(bytes: Vec<u8>) -> String {
    match Gguf::from_bytes(bytes) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn wrong_magic() {
    let mut b = sample().build();
    b[0] = b'X';
    assert!(err(b).contains("not a GGUF file"));
}

#[test]
fn version_1_and_big_endian() {
    let mut s = sample();
    s.version = 1;
    let e = err(s.build());
    assert!(e.contains("version 1"), "{e}");
    s.version = 3u32.swap_bytes();
    assert!(err(s.build()).contains("big-endian"));
    s.version = 2;
    assert!(Gguf::from_bytes(s.build()).is_ok());
}

#[test]
fn truncated_everywhere() {
    let b = sample().build();
    for n in 0..b.len() {
        let e = err(b[..n].to_vec());
        assert!(!e.is_empty());
    }
    // The header itself names what is missing.
    assert!(err(b[..10].to_vec()).contains("truncated"));
}

#[test]
fn huge_counts() {
    let mut b = sample().build();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err(b.clone()).contains("tensor count"));
    let mut b2 = sample().build();
    b2[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(err(b2).contains("kv count"));
    // A string length beyond the file.
    let mut b3 = sample().build();
    b3[24..32].copy_from_slice(&(u64::MAX - 1).to_le_bytes());
    assert!(err(b3).contains("length of key"));
    // An array count beyond the file.
    let mut s = Builder::default();
    let mut v = T_F32.to_le_bytes().to_vec();
    v.extend_from_slice(&(1u64 << 40).to_le_bytes());
    s.kv_raw("arr", T_ARRAY, v);
    assert!(err(s.build()).contains("element count"));
}

#[test]
fn offset_past_end_and_misaligned() {
    let mut s = Builder::default();
    s.tensor_f32("t", &[4], &[0.0; 4]);
    let b = s.build();
    // Tensor offset is the 8 bytes before the alignment padding; find it after the type.
    let info = 24 + 8 + 1 + 4 + 8 + 4;
    let mut b1 = b.clone();
    b1[info..info + 8].copy_from_slice(&64u64.to_le_bytes());
    let e = err(b1);
    assert!(
        e.contains("tensor 't'") && e.contains("past the end"),
        "{e}"
    );
    let mut b2 = b.clone();
    b2[info..info + 8].copy_from_slice(&4u64.to_le_bytes());
    assert!(err(b2).contains("not a multiple of the alignment"));
    let mut b3 = b;
    b3[info..info + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    assert!(!err(b3).is_empty());
}

#[test]
fn unknown_type_and_bad_dims() {
    let mut s = Builder::default();
    s.tensors.push(("weird".into(), vec![32], 99, vec![0; 64]));
    let e = err(s.build());
    assert!(e.contains("'weird'") && e.contains("99"), "{e}");

    let mut s = Builder::default();
    s.tensor("q", &[16], GgmlType::Q4_0, vec![0; 18]);
    assert!(err(s.build()).contains("block size"));

    let mut s = Builder::default();
    s.tensor("z", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0; 4]);
    assert!(err(s.build()).contains("n_dims"));

    let mut s = Builder::default();
    s.tensor(
        "big",
        &[1 << 40, 1 << 40, 1 << 40],
        GgmlType::F32,
        vec![0; 4],
    );
    assert!(err(s.build()).contains("larger than the file"));

    let mut s = Builder::default();
    s.tensor_f32("dup", &[1], &[0.0])
        .tensor_f32("dup", &[1], &[0.0]);
    assert!(err(s.build()).contains("duplicate tensor"));
}

#[test]
fn bad_alignment_and_values() {
    let mut s = sample();
    s.kv_u32("general.alignment", 48);
    assert!(err(s.build()).contains("general.alignment"));
    let mut s = sample();
    s.kv_u32("general.alignment", 0);
    assert!(err(s.build()).contains("power of two"));
    let mut s = sample();
    s.alignment = 64;
    s.kv_u32("general.alignment", 64);
    let g = Gguf::from_bytes(s.build()).unwrap();
    assert_eq!(g.alignment, 64);
    assert!(g.tensors.iter().all(|t| t.offset % 64 == 0));

    let mut s = Builder::default();
    s.kv_raw("b", T_BOOL, vec![2]);
    assert!(err(s.build()).contains("not 0 or 1"));
    let mut s = Builder::default();
    s.kv_raw("x", 13, vec![0; 8]);
    assert!(err(s.build()).contains("unknown value type 13"));
    let mut s = Builder::default();
    s.kv_raw("s", T_STR, {
        let mut v = 2u64.to_le_bytes().to_vec();
        v.extend_from_slice(&[0xff, 0xfe]);
        v
    });
    assert!(err(s.build()).contains("UTF-8"));
    let mut s = Builder::default();
    s.kv_u32("k", 1).kv_u32("k", 2);
    assert!(err(s.build()).contains("duplicate metadata key"));
}

#[test]
fn nested_arrays_bounded() {
    // An array of one array of two u8, then a 100-deep nesting which must be refused.
    let mut v = T_ARRAY.to_le_bytes().to_vec();
    v.extend_from_slice(&1u64.to_le_bytes());
    v.extend_from_slice(&T_U8.to_le_bytes());
    v.extend_from_slice(&2u64.to_le_bytes());
    v.extend_from_slice(&[5, 6]);
    let mut s = Builder::default();
    s.kv_raw("n", T_ARRAY, v);
    let g = Gguf::from_bytes(s.build()).unwrap();
    assert_eq!(
        g.get("n"),
        Some(&Value::Array(Array::Nested(vec![Array::U8(vec![5, 6])])))
    );

    let mut deep = Vec::new();
    for _ in 0..100 {
        deep.extend_from_slice(&T_ARRAY.to_le_bytes());
        deep.extend_from_slice(&1u64.to_le_bytes());
    }
    deep.extend_from_slice(&T_U8.to_le_bytes());
    deep.extend_from_slice(&0u64.to_le_bytes());
    let mut s = Builder::default();
    s.kv_raw("deep", T_ARRAY, deep);
    assert!(err(s.build()).contains("deeper"));
}

#[test]
fn open_missing_file() {
    let e = Gguf::open(Path::new("/nonexistent/x.gguf")).unwrap_err();
    assert!(matches!(&e, FormatError::Io { path, .. } if path == Path::new("/nonexistent/x.gguf")));
    // The caller names the file: the message itself does not, so it is not said twice.
    assert!(!e.to_string().contains("/nonexistent"), "{e}");
}
