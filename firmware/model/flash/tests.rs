//! The flash image's format and reader on images made here (the writer's tests, on real
//! models, are in tools/tests/flash.rs).

use super::*;

#[test]
fn block_geometry_fills_the_read_unit() {
    // SmolLM2-135M (Q4_1, width 576): 360 + 360 + 612 (Q8_0 column) = 1332 bytes, 3 a block.
    let g = LayerGeometry::new(
        1536,
        576,
        GgmlType::Q4_1,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        PAGE,
        1,
    )
    .unwrap();
    assert_eq!((g.per_block, g.blocks, g.block_bytes), (3, 512, 4096));
    // A bundle larger than the unit: one a block, in whole units.
    let g = LayerGeometry::new(
        8960,
        1536,
        GgmlType::Q8_0,
        GgmlType::Q8_0,
        GgmlType::Q8_0,
        PAGE,
        1,
    )
    .unwrap();
    assert_eq!((g.per_block, g.blocks, g.block_bytes), (1, 8960, 8192));
    // Qwen2.5-0.5B's bundle (Q5_0 616 + Q5_0 616 + Q8_0 952 = 2184 bytes) in blocks of three
    // read units: five bundles in 12 KiB (89% used, against 53% at one unit).
    let g = LayerGeometry::new(
        4864,
        896,
        GgmlType::Q5_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        PAGE,
        3,
    )
    .unwrap();
    assert_eq!((g.per_block, g.blocks, g.block_bytes), (5, 973, 3 * 4096));
    // Rows that are not whole blocks of their type.
    assert!(
        LayerGeometry::new(4, 48, GgmlType::Q8_0, GgmlType::F32, GgmlType::F32, PAGE, 1).is_none()
    );
}

fn header() -> Header {
    Header {
        model_identity: 7,
        model_name: "m".into(),
        tables_identity: 9,
        board: "host".into(),
        precision: "native".into(),
        placement: "identity".into(),
        read_unit: PAGE as u32,
        layers: vec![],
        sections: vec![Section {
            kind: SectionKind::Dense,
            offset: PAGE as u64,
            length: 3,
            checksum: checksum(b"abc"),
        }],
    }
}

/// A one-layer image of 5 F32 neurons of width 32 (k = 10 per 4 KiB block: one block),
/// placed in reverse.
fn tiny_image(order: &[u32]) -> Vec<u8> {
    let geo =
        LayerGeometry::new(5, 32, GgmlType::F32, GgmlType::F32, GgmlType::F32, PAGE, 1).unwrap();
    assert_eq!((geo.per_block, geo.blocks), (10, 1));
    let block: Vec<u8> = (0..PAGE).map(|i| (i % 251) as u8).collect();
    let place: Vec<u8> = order.iter().flat_map(|n| n.to_le_bytes()).collect();
    let mut h = header();
    h.layers = vec![geo];
    h.sections.push(Section {
        kind: SectionKind::Ffn(0),
        offset: 2 * PAGE as u64,
        length: PAGE as u64,
        checksum: checksum(&block),
    });
    h.sections.push(Section {
        kind: SectionKind::Placement(0),
        offset: 3 * PAGE as u64,
        length: place.len() as u64,
        checksum: checksum(&place),
    });
    let mut file = encode_header(&h);
    file.resize(PAGE, 0);
    file.extend_from_slice(b"abc");
    file.resize(2 * PAGE, 0);
    file.extend_from_slice(&block);
    file.extend_from_slice(&place);
    file
}

#[test]
fn blocks_and_slots_read_back() {
    let img = FlashImage::from_bytes(tiny_image(&[4, 3, 2, 1, 0])).unwrap();
    img.verify().unwrap();
    assert_eq!(img.blocks(0), 1);
    assert_eq!(img.block_extent(0, 0), (2 * PAGE as u64, PAGE));
    assert_eq!(img.block_neurons(0, 0), &[4, 3, 2, 1, 0]);
    assert_eq!(img.slot_of(0, 4), (0, 0));
    assert_eq!(img.slot_of(0, 1), (0, 3));
    let r = img.block_rows(0, 0);
    assert_eq!(
        (r.gate.rows, r.gate.stride, r.up.ty),
        (5, 128, GgmlType::F32)
    );
    // Gate rows first, then k = 10 up rows' room, then the down columns.
    assert_eq!(r.up.row(0), &img.block_bytes(0, 0)[10 * 128..11 * 128]);
    assert_eq!(
        r.down.row(1),
        &img.block_bytes(0, 0)[20 * 128 + 128..22 * 128]
    );
}

/// No cut and no flipped header byte opens, and none panics.
#[test]
fn every_cut_and_header_flip_is_refused() {
    let file = tiny_image(&[4, 3, 2, 1, 0]);
    let header_end = PREFIX_BYTES + u32::from_le_bytes(file[12..16].try_into().unwrap()) as usize;
    for cut in (0..file.len()).step_by(7).chain([file.len() - 1]) {
        assert!(
            FlashImage::from_bytes(file[..cut].to_vec()).is_err(),
            "cut {cut}"
        );
    }
    for at in 0..header_end {
        let mut v = file.clone();
        v[at] ^= 0x20;
        assert!(FlashImage::from_bytes(v).is_err(), "flip at {at}");
    }
    // A damaged placement; one that is not a permutation (its checksum right).
    let mut v = file.clone();
    v[3 * PAGE] ^= 1;
    let e = FlashImage::from_bytes(v).unwrap_err().to_string();
    assert!(
        e.contains("checksum mismatch in layer 0's placement"),
        "{e}"
    );
    for bad in [[4, 3, 3, 1, 0], [4, 3, 2, 1, 5]] {
        let e = FlashImage::from_bytes(tiny_image(&bad))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("layer 0's placement is not a permutation"),
            "{e}"
        );
    }
}

#[test]
fn header_round_trips_and_refuses_damage() {
    let bytes = encode_header(&header());
    assert_eq!(decode_header(&bytes).unwrap(), header());
    let e = |b: &[u8]| decode_header(b).unwrap_err().to_string();
    assert!(e(b"GGUF\x03\0\0\0").contains("not a LeanStream flash image"));
    assert!(e(&bytes[..5]).contains("truncated"));
    assert!(e(&bytes[..bytes.len() - 1]).contains("truncated"));
    let mut v = bytes.clone();
    v[8] = 2;
    assert!(e(&v).contains("version 2"), "{}", e(&v));
    let mut v = bytes.clone();
    *v.last_mut().unwrap() ^= 0x10;
    assert!(e(&v).contains("checksum"), "{}", e(&v));
}

#[test]
fn opening_checks_sections() {
    let mut file = encode_header(&header());
    file.resize(PAGE, 0);
    file.extend_from_slice(b"abc");
    let img = FlashImage::from_bytes(file.clone()).unwrap();
    assert_eq!(img.dense_bytes(), b"abc");
    img.verify().unwrap();
    let e = FlashImage::from_bytes(file[..PAGE + 2].to_vec()).unwrap_err();
    assert!(
        e.to_string()
            .contains("truncated: the dense part ends at byte 4099"),
        "{e}"
    );
    let mut flipped = file.clone();
    flipped[PAGE + 1] ^= 1;
    let img = FlashImage::from_bytes(flipped).unwrap();
    let e = img.verify().unwrap_err().to_string();
    assert!(e.contains("checksum mismatch in the dense part"), "{e}");
    // Another model, another board: one sentence naming both.
    let img = FlashImage::from_bytes(file).unwrap();
    let e = img.check_for(8, "other", "host").unwrap_err().to_string();
    assert!(
        e.contains("model 'm'") && e.contains("not for 'other'"),
        "{e}"
    );
    let e = img.check_for(7, "m", "jetson").unwrap_err().to_string();
    assert!(e.contains("board 'host', not for board 'jetson'"), "{e}");
    img.check_for(7, "m", "host").unwrap();
}
