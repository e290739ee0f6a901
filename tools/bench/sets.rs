//! Recorded block sets: which blocks of a flash image each layer-step of a real decode asked
//! for (`leanstream stream-bench --record-sets`), so that another machine can replay the same
//! requests over an image of the same geometry (`leanstream gpu-stream-bench`): the values come
//! from the real model run here, the I/O, cache and kernels do their real work there.
//!
//! File: magic `LSSETS\0\0`, version (u32), then per image layer its block count and block
//! bytes, then the steps (layer-major within a token: step s is layer s mod layers), each a
//! count and that many global block ids, ascending, as the gaps between them (the first from
//! 0) in LEB128 varints; u32s little-endian; last the FNV-1a 64 of everything before it.

use leanstream::model::checksum::fnv64;
use leanstream::model::flash::FlashImage;
use std::path::Path;

const MAGIC: &[u8; 8] = b"LSSETS\0\0";
const VERSION: u32 = 2;

/// The recorded sets of one run and the geometry of the image they index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockSets {
    /// Per layer: (blocks, block bytes).
    pub layers: Vec<(u32, u32)>,
    /// Per layer-step, the global block ids asked for.
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
        let mut sorted = Vec::new();
        for s in &self.steps {
            put(&mut v, s.len() as u32);
            sorted.clear();
            sorted.extend_from_slice(s);
            sorted.sort_unstable();
            let mut last = 0;
            for &id in &sorted {
                let mut gap = id - last;
                last = id;
                loop {
                    let byte = (gap & 0x7f) as u8;
                    gap >>= 7;
                    if gap == 0 {
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
        if version != VERSION {
            return Err(format!(
                "block-sets format version {version}; this build reads {VERSION}"
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
            let mut id = 0u64;
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
                id += gap;
                if id >= total {
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
        // Any order in, ascending out.
        let mut shuffled = s.clone();
        shuffled.steps[1] = vec![200, 4, 9];
        assert_eq!(BlockSets::from_bytes(&shuffled.to_bytes()).unwrap(), s);
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
