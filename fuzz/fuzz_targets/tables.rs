//! Fuzzes the table loader (`tables::decode`: header, version, model identity, checksum, postcard
//! payload) with the two table types the firmware loads: the calibrated thresholds
//! (`ThresholdTable`, kind "thresh") and the KV cost model (`CostModel`, kind "kvcost").
//!
//! Input: byte 0 picks the table type (bit 0) and whether the rest is a whole table file (bit 1
//! clear) or only a payload that gets a valid header and checksum, so that the postcard decoder
//! is reached without the fuzzer having to find FNV checksums. Properties: nothing panics; a
//! table that decodes re-encodes to a file that decodes to the same bytes again; the accessors
//! of a decoded table (`check`, `thresholds`, `dropped_mean`) do not panic.
//!
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run tables -- -max_len=4096` (seed corpus: valid tables
//! from gen-seeds.py).
#![no_main]

use leanstream::kv::{CostModel, TABLE_KIND, TABLE_VERSION};
use leanstream::sparsity::{thresholds, Score, ThresholdTable};
use leanstream::tables;
use libfuzzer_sys::fuzz_target;
use serde::{de::DeserializeOwned, Serialize};

/// The model identity the seeds are made for.
const MODEL_ID: u64 = 0x1234_5678_9abc_def0;

fn decode<T: DeserializeOwned + Serialize>(bytes: &[u8], kind: &str, version: u32) -> Option<T> {
    let t: T = tables::decode(bytes, kind, version, MODEL_ID).ok()?;
    // A decoded table re-encodes to a file that decodes, and encoding is then stable.
    let again = tables::encode(kind, version, MODEL_ID, &t);
    let t2: T = tables::decode(&again, kind, version, MODEL_ID).expect("re-encoded table");
    assert_eq!(tables::encode(kind, version, MODEL_ID, &t2), again);
    // Another model's identity or version is refused.
    assert!(tables::decode::<T>(&again, kind, version, MODEL_ID ^ 1).is_err());
    assert!(tables::decode::<T>(&again, kind, version + 1, MODEL_ID).is_err());
    Some(t)
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let thresh = sel & 1 == 0;
    let (kind, version) = if thresh {
        (thresholds::KIND, thresholds::VERSION)
    } else {
        (TABLE_KIND, TABLE_VERSION)
    };
    let file;
    let bytes = if sel & 2 == 0 {
        rest
    } else {
        // Header + checksum around the raw payload (what `tables::encode` writes).
        let mut f = b"LSTB".to_vec();
        let mut k = [0u8; 8];
        k[..kind.len()].copy_from_slice(kind.as_bytes());
        f.extend_from_slice(&k);
        f.extend_from_slice(&version.to_le_bytes());
        f.extend_from_slice(&MODEL_ID.to_le_bytes());
        f.extend_from_slice(&(rest.len() as u64).to_le_bytes());
        f.extend_from_slice(&tables::fnv64(rest).to_le_bytes());
        f.extend_from_slice(rest);
        file = f;
        &file[..]
    };
    if thresh {
        let Some(t) = decode::<ThresholdTable>(bytes, kind, version) else {
            return;
        };
        for l in &t.levels {
            for score in [Score::Glu, Score::Gate] {
                let _ = t.thresholds(l.sparsity, score);
                let _ = t.dropped_mean(l.sparsity, score);
            }
        }
        let _ = t.thresholds(0.5, Score::Glu);
    } else if let Some(m) = decode::<CostModel>(bytes, kind, version) {
        let _ = m.check();
    }
});
