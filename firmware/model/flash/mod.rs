//! The flash image: one file that holds a model laid out for SSD streaming (DESIGN.md section
//! 5, LeanStream paper 3.2.2), written offline by `leanstream flash` (`tools/offline/flash.rs`)
//! and read here by the runtime.
//!
//! Layout (little-endian):
//!
//! ```text
//! 0      magic "LSFLASH\0" | format version: u32 | header length: u32 | header checksum: u64
//! 24     header: postcard-encoded [`Header`]
//!        zero padding to 4 KiB
//! 4 KiB  sections, each starting on a 4 KiB boundary, in the order of the section table:
//!        dense     a GGUF file: every metadata key of the source (vocabulary, chat template)
//!                  and every tensor but the FFN's gate, up and down, in the image's precision
//!        ffn n     layer n's FFN as blocks of `per_block` neuron bundles; each block is
//!                  [k gate rows][k up rows][k down columns], zero-padded to a whole number of
//!                  read units (4 KiB), so O_DIRECT reads a block as it is
//!        place n   layer n's placement: u32 per slot, the neuron stored in it (slot s is
//!                  entry s % k of block s / k)
//!        thresh    the thresholds table file, as `leanstream calibrate` wrote it (optional)
//!        freq      per block, layer-major, u32: how many tokens of the profiling trace used it
//!                  (written with `--trace`; the `hot` cache policy pins the most used)
//! ```
//!
//! Checksums are FNV-1a 64 as in `crate::tables` (its own copy: `tables` reads `model`, so
//! `model` cannot read `tables`): the header's covers the version, the length and the postcard
//! bytes; each section's covers its bytes. Opening verifies the header, that every section lies
//! inside the file, the geometry, and the placement sections; [`FlashImage::verify`] checks the
//! rest (the dense part and the FFN blocks) on request.
//!
//! The model identity ([`model_identity`]) is a hash over the source GGUF's metadata (every key
//! and value) and its tensor table (name, type, shape), not over the tensor bytes: it tells
//! models and quantizations apart at the cost of reading the header only.

use super::ggml::GgmlType;
use super::gguf::{FormatError, Gguf};
use super::ModelFile;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

pub const MAGIC: &[u8; 8] = b"LSFLASH\0";
/// 1: the first layout.
pub const VERSION: u32 = 1;
/// Bytes before the postcard header.
pub const PREFIX_BYTES: usize = 8 + 4 + 4 + 8;
/// Every section and every FFN block starts on a multiple of this (O_DIRECT's alignment).
pub const PAGE: usize = 4096;
/// Headers longer than this are refused before anything is allocated for them.
const MAX_HEADER_BYTES: usize = 16 << 20;

/// What a section holds.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SectionKind {
    Dense,
    Ffn(u32),
    Placement(u32),
    Thresholds,
    /// Per block (layer-major, u32): in how many tokens of the profiling trace it was used.
    Frequency,
}

impl fmt::Display for SectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SectionKind::Dense => f.write_str("the dense part"),
            SectionKind::Ffn(l) => write!(f, "layer {l}'s FFN blocks"),
            SectionKind::Placement(l) => write!(f, "layer {l}'s placement"),
            SectionKind::Thresholds => f.write_str("the thresholds table"),
            SectionKind::Frequency => f.write_str("the block frequencies"),
        }
    }
}

/// One entry of the section table.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Section {
    pub kind: SectionKind,
    pub offset: u64,
    pub length: u64,
    /// FNV-1a 64 of the section's bytes.
    pub checksum: u64,
}

/// One layer's FFN blocks: how many neurons, how they are grouped and typed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerGeometry {
    /// Neurons (the FFN's hidden width).
    pub neurons: u32,
    /// Model width: values per gate row, up row and down column.
    pub dim: u32,
    /// Bundles per block (k).
    pub per_block: u32,
    /// Blocks: ceil(neurons / per_block); the last may hold fewer bundles (the rest is zero).
    pub blocks: u32,
    /// Bytes per block: a whole number of read units.
    pub block_bytes: u32,
    /// GGML type ids of the gate rows, up rows and down columns.
    pub gate_type: u32,
    pub up_type: u32,
    pub down_type: u32,
}

impl LayerGeometry {
    /// The geometry of a layer of `neurons` bundles of `dim` values: as many bundles per block
    /// as fill `units` read units (at least one bundle), each block rounded up to whole read
    /// units. None when a row of `dim` values is not whole blocks of one of the types.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        neurons: usize,
        dim: usize,
        gate: GgmlType,
        up: GgmlType,
        down: GgmlType,
        read_unit: usize,
        units: usize,
    ) -> Option<LayerGeometry> {
        let bundle = gate.row_bytes(dim)? + up.row_bytes(dim)? + down.row_bytes(dim)?;
        let k = (units.max(1) * read_unit / bundle).max(1);
        let block = (k * bundle).next_multiple_of(read_unit);
        Some(LayerGeometry {
            neurons: u32::try_from(neurons).ok()?,
            dim: u32::try_from(dim).ok()?,
            per_block: u32::try_from(k).ok()?,
            blocks: u32::try_from(neurons.div_ceil(k)).ok()?,
            block_bytes: u32::try_from(block).ok()?,
            gate_type: gate as u32,
            up_type: up as u32,
            down_type: down as u32,
        })
    }

    /// The three types, when every id is known.
    pub fn types(&self) -> Option<(GgmlType, GgmlType, GgmlType)> {
        Some((
            GgmlType::from_id(self.gate_type)?,
            GgmlType::from_id(self.up_type)?,
            GgmlType::from_id(self.down_type)?,
        ))
    }

    /// Bytes of one gate row, up row and down column.
    pub fn part_bytes(&self) -> Option<(usize, usize, usize)> {
        let (g, u, d) = self.types()?;
        let dim = self.dim as usize;
        Some((g.row_bytes(dim)?, u.row_bytes(dim)?, d.row_bytes(dim)?))
    }

    /// The bundles of the block `bytes` (`rows` of them: `per_block`, or fewer in the last
    /// block), part by part. `bytes` is a block as read (a cache slot). Each part converts into
    /// the CPU kernels' `quant::view::Rows` (`Rows::from`). Panics on a geometry that
    /// [`FlashImage`] would not have opened, or a short `bytes`.
    pub fn view<'a>(&self, bytes: &'a [u8], rows: usize) -> BlockRows<'a> {
        let (gt, ut, dt) = self.types().expect("a checked geometry");
        let (g, u, d) = self.part_bytes().expect("a checked geometry");
        let k = self.per_block as usize;
        assert!(rows <= k && bytes.len() >= self.block_bytes as usize);
        let part = |ty, at: usize, stride| Part {
            ty,
            rows,
            cols: self.dim as usize,
            stride,
            data: &bytes[at..at + k * stride],
        };
        BlockRows {
            gate: part(gt, 0, g),
            up: part(ut, k * g, u),
            down: part(dt, k * (g + u), d),
        }
    }
}

/// Rows of one part of a block (gate rows, up rows or down columns): row `r` is the
/// `ty.row_bytes(cols)` bytes at `data[r * stride..]`. `Rows::from` (in `quant::view`, a layer
/// above this one) makes the kernels' view of it.
#[derive(Clone, Copy, Debug)]
pub struct Part<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
    pub data: &'a [u8],
}

impl<'a> Part<'a> {
    /// Row `r`'s bytes.
    pub fn row(&self, r: usize) -> &'a [u8] {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        &self.data[r * self.stride..(r + 1) * self.stride]
    }
}

/// A block's bundles: row i of each part is the i-th neuron of the block.
#[derive(Clone, Copy, Debug)]
pub struct BlockRows<'a> {
    pub gate: Part<'a>,
    pub up: Part<'a>,
    /// Down columns, one row of `dim` values each.
    pub down: Part<'a>,
}

/// The image's header.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Header {
    /// [`model_identity`] of the source GGUF.
    pub model_identity: u64,
    /// The source's `general.name` (or its file name): for messages.
    pub model_name: String,
    /// `crate::tables::model_identity` of the source: the key the thresholds table is checked
    /// against (it hashes tensor bytes the image no longer holds in GGUF form).
    pub tables_identity: u64,
    /// The board the image was made for (`board-configs/<name>.toml`'s `[board] name`).
    pub board: String,
    /// `native`, `w8a8`, `w4a8` (`crate::quant::Precision`'s names).
    pub precision: String,
    /// How neurons were placed into blocks: `identity`, `greedy`.
    pub placement: String,
    /// The read unit blocks are sized in (4 KiB, or the board's larger `block_align`).
    pub read_unit: u32,
    pub layers: Vec<LayerGeometry>,
    pub sections: Vec<Section>,
}

/// Whether the file at `path` starts with the flash image's magic (a model argument may name
/// an image instead of a GGUF). False when it cannot be read.
pub fn is_flash_image(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == MAGIC
}

/// Why an image could not be opened or used.
#[derive(Debug)]
pub enum FlashError {
    Io {
        path: PathBuf,
        err: std::io::Error,
    },
    /// The file does not start with the image magic.
    NotAnImage,
    /// The file ends before `what`, which needs `need` bytes of which `have` are there.
    Truncated {
        what: &'static str,
        need: u64,
        have: u64,
    },
    WrongVersion {
        found: u32,
    },
    HeaderChecksum,
    /// The header's bytes are not a header of this version.
    HeaderDecode(postcard::Error),
    /// A section that reaches past the end of the file.
    SectionOutOfFile {
        kind: SectionKind,
        end: u64,
        file: u64,
    },
    SectionMisaligned {
        kind: SectionKind,
        offset: u64,
    },
    SectionMissing(SectionKind),
    SectionChecksum(SectionKind),
    /// A layer's geometry that does not add up (`what` says which part).
    Geometry {
        layer: usize,
        what: &'static str,
    },
    /// A placement that is not a permutation of the layer's neurons.
    Placement {
        layer: usize,
    },
    OtherModel {
        image: String,
        image_identity: u64,
        expected: String,
        expected_identity: u64,
    },
    OtherBoard {
        image: String,
        expected: String,
    },
    /// The dense part does not read as a GGUF model.
    Dense(FormatError),
}

impl fmt::Display for FlashError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlashError::Io { path, err } => write!(f, "{}: {err}", path.display()),
            FlashError::NotAnImage => {
                f.write_str("not a LeanStream flash image (bad magic): make one with `leanstream flash`")
            }
            FlashError::Truncated { what, need, have } => write!(
                f,
                "flash image is truncated: {what} needs {need} bytes, the file has {have}"
            ),
            FlashError::WrongVersion { found } => write!(
                f,
                "flash image format version {found}, this build reads version {VERSION}: write the image again with this build's `leanstream flash`"
            ),
            FlashError::HeaderChecksum => {
                f.write_str("flash image header is damaged (checksum mismatch)")
            }
            FlashError::HeaderDecode(e) => write!(f, "flash image header is damaged: {e}"),
            FlashError::SectionOutOfFile { kind, end, file } => write!(
                f,
                "flash image is truncated: {kind} ends at byte {end}, the file has {file}"
            ),
            FlashError::SectionMisaligned { kind, offset } => write!(
                f,
                "flash image is damaged: {kind} starts at byte {offset}, not on a 4 KiB boundary"
            ),
            FlashError::SectionMissing(kind) => {
                write!(f, "flash image is damaged: it has no section for {kind}")
            }
            FlashError::SectionChecksum(kind) => {
                write!(f, "flash image is damaged: checksum mismatch in {kind}")
            }
            FlashError::Geometry { layer, what } => {
                write!(f, "flash image is damaged: layer {layer}'s {what} does not add up")
            }
            FlashError::Placement { layer } => write!(
                f,
                "flash image is damaged: layer {layer}'s placement is not a permutation of its neurons"
            ),
            FlashError::OtherModel {
                image,
                image_identity,
                expected,
                expected_identity,
            } => write!(
                f,
                "this flash image was made for model '{image}' (identity {image_identity:016x}), not for '{expected}' (identity {expected_identity:016x}): write one for it with `leanstream flash`"
            ),
            FlashError::OtherBoard { image, expected } => write!(
                f,
                "this flash image was made for board '{image}', not for board '{expected}': write one with `leanstream flash --board {expected}`"
            ),
            FlashError::Dense(e) => write!(f, "flash image's dense part: {e}"),
        }
    }
}

impl std::error::Error for FlashError {}

/// FNV-1a 64 of `bytes`: the checksum of a section (`model::checksum`, as the tables use).
pub use super::checksum::fnv64 as checksum;
/// A checksum computed piece by piece (the writer's sections are made block by block).
pub use super::checksum::Fnv64 as Checksum;

/// The model identity of a GGUF (see the module's comment): every metadata key with its
/// encoded value, then every tensor's name, type and dims, in file order.
pub fn model_identity(g: &Gguf) -> u64 {
    let mut h = Checksum::default();
    for (k, v) in g.metadata() {
        let (ty, bytes) = v.encode();
        h.write(k.as_bytes());
        h.write(&ty.to_le_bytes());
        h.write(&bytes);
    }
    for t in &g.tensors {
        h.write(t.name.as_bytes());
        h.write(&(t.ty as u32).to_le_bytes());
        for d in &t.dims {
            h.write(&(*d as u64).to_le_bytes());
        }
    }
    h.finish()
}

/// The first bytes of an image: the fixed prefix and the postcard header. The sections start
/// at this length rounded up to [`PAGE`].
pub fn encode_header(header: &Header) -> Vec<u8> {
    let body = postcard::to_allocvec(header).expect("postcard encodes the header");
    let len = body.len() as u32;
    let mut sum = Checksum::default();
    sum.write(&VERSION.to_le_bytes());
    sum.write(&len.to_le_bytes());
    sum.write(&body);
    let mut out = Vec::with_capacity(PREFIX_BYTES + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&sum.finish().to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Decodes and checks the prefix and header at the start of `bytes` (the whole file, or at
/// least its header).
pub fn decode_header(bytes: &[u8]) -> Result<Header, FlashError> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(if MAGIC.starts_with(bytes) {
            FlashError::Truncated {
                what: "the header",
                need: PREFIX_BYTES as u64,
                have: bytes.len() as u64,
            }
        } else {
            FlashError::NotAnImage
        });
    }
    if bytes.len() < PREFIX_BYTES {
        return Err(FlashError::Truncated {
            what: "the header",
            need: PREFIX_BYTES as u64,
            have: bytes.len() as u64,
        });
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
    let version = u32_at(8);
    if version != VERSION {
        return Err(FlashError::WrongVersion { found: version });
    }
    let len = u32_at(12) as usize;
    let sum = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    if len > MAX_HEADER_BYTES {
        return Err(FlashError::HeaderChecksum);
    }
    let Some(body) = bytes.get(PREFIX_BYTES..PREFIX_BYTES + len) else {
        return Err(FlashError::Truncated {
            what: "the header",
            need: (PREFIX_BYTES + len) as u64,
            have: bytes.len() as u64,
        });
    };
    let mut h = Checksum::default();
    h.write(&bytes[8..16]);
    h.write(body);
    if h.finish() != sum {
        return Err(FlashError::HeaderChecksum);
    }
    postcard::from_bytes(body).map_err(FlashError::HeaderDecode)
}

enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// An opened, checked flash image.
pub struct FlashImage {
    backing: Backing,
    /// The file (None for an image in memory).
    path: Option<PathBuf>,
    pub header: Header,
    /// Per layer: its FFN section and its placement (slot -> neuron) and inverse.
    ffn: Vec<Section>,
    slots: Vec<Vec<u32>>,
    slot_of: Vec<Vec<u32>>,
    dense: Section,
    thresholds: Option<Section>,
    frequency: Option<Section>,
}

impl fmt::Debug for FlashImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlashImage")
            .field("path", &self.path)
            .field("bytes", &self.bytes().len())
            .field("model", &self.header.model_name)
            .field("board", &self.header.board)
            .field("layers", &self.header.layers.len())
            .finish()
    }
}

impl FlashImage {
    /// Maps `path` and checks it (see the module's comment for what opening checks).
    pub fn open(path: &Path) -> Result<FlashImage, FlashError> {
        let io = |err| FlashError::Io {
            path: path.to_path_buf(),
            err,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        if file.metadata().map_err(io)?.len() == 0 {
            return Err(FlashError::Truncated {
                what: "the header",
                need: PREFIX_BYTES as u64,
                have: 0,
            });
        }
        // SAFETY: read-only; as with model files, an image is not modified while it is open.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::check(Backing::Mmap(map), Some(path.to_path_buf()))
    }

    /// [`FlashImage::open`] for an image in memory (tests).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<FlashImage, FlashError> {
        Self::check(Backing::Owned(bytes), None)
    }

    fn check(backing: Backing, path: Option<PathBuf>) -> Result<FlashImage, FlashError> {
        let bytes: &[u8] = match &backing {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        };
        let header = decode_header(bytes)?;
        let file = bytes.len() as u64;
        for s in &header.sections {
            let end = s.offset.saturating_add(s.length);
            if end > file {
                return Err(FlashError::SectionOutOfFile {
                    kind: s.kind,
                    end,
                    file,
                });
            }
            if !s.offset.is_multiple_of(PAGE as u64) {
                return Err(FlashError::SectionMisaligned {
                    kind: s.kind,
                    offset: s.offset,
                });
            }
        }
        let find = |kind| {
            header
                .sections
                .iter()
                .find(|s| s.kind == kind)
                .copied()
                .ok_or(FlashError::SectionMissing(kind))
        };
        let dense = find(SectionKind::Dense)?;
        let thresholds = find(SectionKind::Thresholds).ok();
        let frequency = find(SectionKind::Frequency).ok();
        let unit = header.read_unit as usize;
        if unit == 0 || !unit.is_multiple_of(PAGE) {
            return Err(FlashError::Geometry {
                layer: 0,
                what: "read unit",
            });
        }
        let (mut ffn, mut slots, mut slot_of) = (Vec::new(), Vec::new(), Vec::new());
        for (l, g) in header.layers.iter().enumerate() {
            let bad = |what| FlashError::Geometry { layer: l, what };
            let (gb, ub, db) = g.part_bytes().ok_or(bad("row types"))?;
            let (n, k) = (g.neurons as usize, g.per_block as usize);
            let block = g.block_bytes as usize;
            if k == 0 || g.blocks as usize != n.div_ceil(k) {
                return Err(bad("block count"));
            }
            let need = gb
                .checked_add(ub)
                .and_then(|b| b.checked_add(db))
                .and_then(|b| b.checked_mul(k));
            if need.is_none_or(|need| block < need) || !block.is_multiple_of(unit) {
                return Err(bad("block size"));
            }
            let f = find(SectionKind::Ffn(l as u32))?;
            if f.length != g.blocks as u64 * block as u64 {
                return Err(bad("FFN section length"));
            }
            let p = find(SectionKind::Placement(l as u32))?;
            if p.length != 4 * n as u64 {
                return Err(bad("placement length"));
            }
            let raw = &bytes[p.offset as usize..][..p.length as usize];
            if checksum(raw) != p.checksum {
                return Err(FlashError::SectionChecksum(p.kind));
            }
            let perm: Vec<u32> = raw
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect();
            let mut inverse = vec![u32::MAX; n];
            for (slot, &neuron) in perm.iter().enumerate() {
                match inverse.get_mut(neuron as usize) {
                    Some(s) if *s == u32::MAX => *s = slot as u32,
                    _ => return Err(FlashError::Placement { layer: l }),
                }
            }
            ffn.push(f);
            slots.push(perm);
            slot_of.push(inverse);
        }
        if let Some(t) = thresholds {
            let raw = &bytes[t.offset as usize..][..t.length as usize];
            if checksum(raw) != t.checksum {
                return Err(FlashError::SectionChecksum(t.kind));
            }
        }
        if let Some(fq) = frequency {
            let blocks: u64 = header.layers.iter().map(|g| g.blocks as u64).sum();
            if fq.length != 4 * blocks {
                return Err(FlashError::Geometry {
                    layer: 0,
                    what: "block frequency length",
                });
            }
            let raw = &bytes[fq.offset as usize..][..fq.length as usize];
            if checksum(raw) != fq.checksum {
                return Err(FlashError::SectionChecksum(fq.kind));
            }
        }
        Ok(FlashImage {
            backing,
            path,
            header,
            ffn,
            slots,
            slot_of,
            dense,
            thresholds,
            frequency,
        })
    }

    /// The file it was opened from (None for an image in memory).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }

    fn section(&self, s: &Section) -> &[u8] {
        &self.bytes()[s.offset as usize..][..s.length as usize]
    }

    /// Checks every section's checksum (the dense part and the FFN blocks too: it reads the
    /// whole file).
    pub fn verify(&self) -> Result<(), FlashError> {
        for s in &self.header.sections {
            if checksum(self.section(s)) != s.checksum {
                return Err(FlashError::SectionChecksum(s.kind));
            }
        }
        Ok(())
    }

    /// Refuses an image made for another model (`identity` is [`model_identity`] of the
    /// model the caller was given, `name` how to call it) or another board.
    pub fn check_for(&self, identity: u64, name: &str, board: &str) -> Result<(), FlashError> {
        if self.header.model_identity != identity {
            return Err(FlashError::OtherModel {
                image: self.header.model_name.clone(),
                image_identity: self.header.model_identity,
                expected: name.to_string(),
                expected_identity: identity,
            });
        }
        self.check_board(board)
    }

    /// Refuses an image made for another board than `board` (`crate::board::NAME` at boot).
    pub fn check_board(&self, board: &str) -> Result<(), FlashError> {
        if self.header.board != board {
            return Err(FlashError::OtherBoard {
                image: self.header.board.clone(),
                expected: board.to_string(),
            });
        }
        Ok(())
    }

    /// The dense part: a GGUF file's bytes.
    pub fn dense_bytes(&self) -> &[u8] {
        self.section(&self.dense)
    }

    /// The dense part as a model file: mapped from the image file in place (or copied, for an
    /// image in memory). It holds every tensor but the FFN's.
    pub fn dense_model(&self) -> Result<ModelFile, FlashError> {
        let g = match &self.path {
            Some(p) => Gguf::open_range(p, self.dense.offset, self.dense.length as usize),
            None => Gguf::from_bytes(self.dense_bytes().to_vec()),
        };
        g.map(ModelFile::Gguf).map_err(FlashError::Dense)
    }

    /// The thresholds table file's bytes, when the image holds one (decode it with
    /// `crate::tables::decode` against `header.tables_identity`).
    pub fn thresholds_bytes(&self) -> Option<&[u8]> {
        self.thresholds.as_ref().map(|s| self.section(s))
    }

    /// Every block's profiled frequency (layer-major, as the section holds them), when the
    /// image was written with a trace.
    pub fn block_frequency(&self) -> Option<Vec<u32>> {
        let s = self.frequency.as_ref()?;
        Some(
            self.section(s)
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect(),
        )
    }

    pub fn layers(&self) -> usize {
        self.header.layers.len()
    }

    pub fn geometry(&self, layer: usize) -> &LayerGeometry {
        &self.header.layers[layer]
    }

    /// Blocks of `layer`.
    pub fn blocks(&self, layer: usize) -> usize {
        self.header.layers[layer].blocks as usize
    }

    /// Where block `block` of `layer` lies in the file: (offset, length), both multiples of
    /// 4 KiB.
    pub fn block_extent(&self, layer: usize, block: usize) -> (u64, usize) {
        let g = &self.header.layers[layer];
        assert!(block < g.blocks as usize, "block {block} of {}", g.blocks);
        let len = g.block_bytes as usize;
        (self.ffn[layer].offset + (block * len) as u64, len)
    }

    /// The neurons stored in a block, in slot order.
    pub fn block_neurons(&self, layer: usize, block: usize) -> &[u32] {
        let k = self.header.layers[layer].per_block as usize;
        let slots = &self.slots[layer];
        &slots[(block * k).min(slots.len())..((block + 1) * k).min(slots.len())]
    }

    /// Where `neuron` of `layer` is stored: (block, index in the block).
    pub fn slot_of(&self, layer: usize, neuron: usize) -> (usize, usize) {
        let k = self.header.layers[layer].per_block as usize;
        let s = self.slot_of[layer][neuron] as usize;
        (s / k, s % k)
    }

    /// The block of a neuron (one division: the runtime's hot path).
    pub fn block_of(&self, layer: usize, neuron: usize) -> usize {
        self.slot_of(layer, neuron).0
    }

    /// A block's bytes in the file.
    pub fn block_bytes(&self, layer: usize, block: usize) -> &[u8] {
        let (at, len) = self.block_extent(layer, block);
        &self.bytes()[at as usize..][..len]
    }

    /// A block's bundles, read from the file, as row views (row i is `block_neurons()[i]`).
    pub fn block_rows(&self, layer: usize, block: usize) -> BlockRows<'_> {
        let rows = self.block_neurons(layer, block).len();
        self.header.layers[layer].view(self.block_bytes(layer, block), rows)
    }
}

#[cfg(test)]
mod tests;
