//! Recorded block sets: which blocks of a flash image each layer-step of a real decode asked
//! for (`leanstream stream-bench --record-sets`), so that another machine can replay the same
//! requests over an image of the same geometry (`leanstream gpu-stream-bench`): the values come
//! from the real model run here, the I/O, cache and kernels do their real work there.
//!
//! File: magic `LSSETS\0\0`, version (u32), then per image layer its block count and block
//! bytes, then the steps (layer-major within a token: step s is layer s mod layers), each a
//! count and that many global block ids in the order they were asked for (highest priority
//! first: the order a replay asks for them again), each as its difference from the one before
//! (the first from 0), zigzag-coded, in LEB128 varints; u32s little-endian; last the FNV-1a 64
//! of everything before it. Version 2 (still read) held each step ascending, as plain gaps:
//! its replays ask in block order.

use leanstream::model::checksum::fnv64;
use leanstream::model::flash::FlashImage;
use std::path::Path;

const MAGIC: &[u8; 8] = b"LSSETS\0\0";
const VERSION: u32 = 3;
/// Ascending ids as gaps (no order kept).
const VERSION_ASCENDING: u32 = 2;

/// The recorded sets of one run and the geometry of the image they index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockSets {
    /// Per layer: (blocks, block bytes).
    pub layers: Vec<(u32, u32)>,
    /// Per layer-step, the global block ids asked for, in the order asked.
    pub steps: Vec<Vec<u32>>,
}

impl BlockSets {
    /// The sets `steps` recorded over `image`.
    pub fn new(image: &FlashImage, steps: Vec<Vec<u32>>) -> BlockSets {
        BlockSets {
            layers: geometry(image),
            steps,
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        let put = |v: &mut Vec<u8>, w: u32| v.extend_from_slice(&w.to_le_bytes());
        put(&mut v, VERSION);
        put(&mut v, self.layers.len() as u32);
        for &(b, bytes) in &self.layers {
            put(&mut v, b);
            put(&mut v, bytes);
        }
        put(&mut v, self.steps.len() as u32);
        for s in &self.steps {
            put(&mut v, s.len() as u32);
            let mut last = 0i64;
            for &id in s {
                let d = id as i64 - last;
                last = id as i64;
                let mut z = ((d << 1) ^ (d >> 63)) as u64;
                loop {
                    let byte = (z & 0x7f) as u8;
                    z >>= 7;
                    if z == 0 {
                        v.push(byte);
                        break;
                    }
                    v.push(byte | 0x80);
                }
            }
        }
        let sum = fnv64(&v);
        v.extend_from_slice(&sum.to_le_bytes());
        v
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<BlockSets, String> {
        if bytes.len() < 8 + 4 + 8 || &bytes[..8] != MAGIC {
            return Err("not a block-sets file (stream-bench --record-sets writes them)".into());
        }
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        if fnv64(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
            return Err("the block-sets file is damaged (checksum mismatch)".into());
        }
        let mut at = 8;
        fn word(body: &[u8], at: &mut usize) -> Result<u32, String> {
            let w = body
                .get(*at..*at + 4)
                .ok_or("the block-sets file ends early")?;
            *at += 4;
            Ok(u32::from_le_bytes(w.try_into().expect("4 bytes")))
        }
        let version = word(body, &mut at)?;
        if version != VERSION && version != VERSION_ASCENDING {
            return Err(format!(
                "block-sets format version {version}; this build reads {VERSION_ASCENDING} and {VERSION}"
            ));
        }
        let n = word(body, &mut at)? as usize;
        let mut layers = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            layers.push((word(body, &mut at)?, word(body, &mut at)?));
        }
        let total: u64 = layers.iter().map(|&(b, _)| b as u64).sum();
        let steps_n = word(body, &mut at)? as usize;
        let mut steps = Vec::with_capacity(steps_n.min(1 << 20));
        for _ in 0..steps_n {
            let k = word(body, &mut at)? as usize;
            let mut s = Vec::with_capacity(k.min(1 << 20));
            let mut id = 0i64;
            for _ in 0..k {
                let (mut gap, mut shift) = (0u64, 0);
                loop {
                    let &b = body.get(at).ok_or("the block-sets file ends early")?;
                    at += 1;
                    gap |= ((b & 0x7f) as u64) << shift;
                    shift += 7;
                    if b & 0x80 == 0 {
                        break;
                    }
                    if shift > 35 {
                        return Err("a block id in the block-sets file is malformed".into());
                    }
                }
                id += match version {
                    VERSION_ASCENDING => gap as i64,
                    _ => (gap >> 1) as i64 ^ -((gap & 1) as i64),
                };
                if id < 0 || id as u64 >= total {
                    return Err(format!("block {id} past the {total} blocks the file names"));
                }
                s.push(id as u32);
            }
            steps.push(s);
        }
        Ok(BlockSets { layers, steps })
    }

    pub fn write(&self, path: &Path) -> Result<(), String> {
        std::fs::write(path, self.to_bytes()).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn read(path: &Path) -> Result<BlockSets, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        BlockSets::from_bytes(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Whether `image` has the geometry the sets were recorded over (layers, blocks, block
    /// bytes): a same-shape image of another model replays them block for block.
    pub fn check_image(&self, image: &FlashImage) -> Result<(), String> {
        let g = geometry(image);
        if g != self.layers {
            let first = g
                .iter()
                .zip(&self.layers)
                .position(|(a, b)| a != b)
                .unwrap_or(g.len().min(self.layers.len()));
            if g.len() != self.layers.len() {
                return Err(format!(
                    "the sets were recorded over an image of {} layers; this one has {}",
                    self.layers.len(),
                    g.len()
                ));
            }
            let (b, bytes) = self.layers[first];
            let (here_b, here_bytes) = g[first];
            return Err(format!(
                "the sets were recorded over an image of another geometry: layer {first} had {b} blocks of {bytes} bytes there, {here_b} of {here_bytes} here"
            ));
        }
        Ok(())
    }
}

fn geometry(image: &FlashImage) -> Vec<(u32, u32)> {
    (0..image.layers())
        .map(|l| {
            let g = image.geometry(l);
            (g.blocks, g.block_bytes)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let s = BlockSets {
            layers: vec![(4, 4096), (600, 8192)],
            steps: vec![vec![0, 3], vec![4, 9, 200], vec![]],
        };
        let b = s.to_bytes();
        assert_eq!(BlockSets::from_bytes(&b).unwrap(), s);
        // The order asked for is kept.
        let mut shuffled = s.clone();
        shuffled.steps[1] = vec![200, 4, 9];
        assert_eq!(
            BlockSets::from_bytes(&shuffled.to_bytes()).unwrap(),
            shuffled
        );
        // Version 2: ascending gaps.
        let mut v2 = MAGIC.to_vec();
        for w in [2u32, 1, 300, 8192, 1, 3] {
            v2.extend_from_slice(&w.to_le_bytes());
        }
        v2.extend_from_slice(&[4, 0x81, 0x01, 3]);
        let sum = fnv64(&v2);
        v2.extend_from_slice(&sum.to_le_bytes());
        let old = BlockSets::from_bytes(&v2).unwrap();
        assert_eq!(old.steps, vec![vec![4, 133, 136]]);
        let mut bad = b.clone();
        bad[14] ^= 1;
        assert!(BlockSets::from_bytes(&bad).unwrap_err().contains("damaged"));
        assert!(BlockSets::from_bytes(&b[..b.len() - 3])
            .unwrap_err()
            .contains("damaged"));
        assert!(BlockSets::from_bytes(b"LSFLASH\0xxxxxxxxxxxxxxxxxxxx")
            .unwrap_err()
            .contains("not a block-sets"));
        // A block id past the layers' blocks is refused even with a good checksum.
        let mut far = s.clone();
        far.steps[0][0] = 604;
        assert!(BlockSets::from_bytes(&far.to_bytes())
            .unwrap_err()
            .contains("past the 604 blocks"));
    }
}
