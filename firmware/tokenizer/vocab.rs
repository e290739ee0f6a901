//! Vocabulary loading: the plain-data [`VocabSpec`], its GGUF reader, the llama2.c reader, and the
//! tables [`Tokenizer`] encodes and decodes with.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::Path;

use super::pretok::PreTokenizer;
use super::unicode::{byte_to_char_table, char_to_byte};
use super::{Algo, Tokenizer, TokenizerError};

/// A small fast hasher (FxHash) for the token and merge maps.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(K);
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(i as u64)
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64)
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64)
    }
    fn finish(&self) -> u64 {
        // A final avalanche (splitmix64's), so that the low bits the table indexes with depend on
        // every input byte.
        let mut h = self.0;
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^ (h >> 31)
    }
}

pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;

/// A token's type (`tokenizer.ggml.token_type`, the SentencePiece piece types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    fn from_i32(v: i32) -> TokenType {
        match v {
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Normal,
        }
    }
}

/// Plain vocabulary data, as the GGUF `tokenizer.ggml.*` keys hold it.
#[derive(Debug, Clone, Default)]
pub struct VocabSpec {
    /// `tokenizer.ggml.model`: `"gpt2"` or `"llama"`.
    pub model: String,
    /// `tokenizer.ggml.pre` (byte-level BPE only).
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// Per-token scores (SentencePiece); empty: all zero.
    pub scores: Vec<f32>,
    /// Per-token types (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte); empty:
    /// all normal.
    pub token_types: Vec<i32>,
    /// Byte-level BPE merges, `"left right"`, highest priority first.
    pub merges: Vec<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; `None`: true for SentencePiece, false for byte-level BPE.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`; `None`: true (SentencePiece only).
    pub add_space_prefix: Option<bool>,
}

impl VocabSpec {
    /// Reads the `tokenizer.ggml.*` keys of a GGUF file.
    pub fn from_gguf(g: &crate::model::gguf::Gguf) -> Result<VocabSpec, TokenizerError> {
        let model = g
            .get_str("tokenizer.ggml.model")
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.model"))?
            .to_string();
        let tokens = g
            .get_str_array("tokenizer.ggml.tokens")
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.tokens"))?
            .to_vec();
        Ok(VocabSpec {
            model,
            pre: g.get_str("tokenizer.ggml.pre").map(str::to_string),
            tokens,
            scores: g
                .get_f32_array("tokenizer.ggml.scores")
                .map(<[f32]>::to_vec)
                .unwrap_or_default(),
            token_types: g
                .get_i32_array("tokenizer.ggml.token_type")
                .map(<[i32]>::to_vec)
                .unwrap_or_default(),
            merges: g
                .get_str_array("tokenizer.ggml.merges")
                .map(<[String]>::to_vec)
                .unwrap_or_default(),
            bos: g.get_u32("tokenizer.ggml.bos_token_id"),
            eos: g.get_u32("tokenizer.ggml.eos_token_id"),
            eot: g.get_u32("tokenizer.ggml.eot_token_id"),
            eom: g.get_u32("tokenizer.ggml.eom_token_id"),
            unk: g.get_u32("tokenizer.ggml.unknown_token_id"),
            pad: g.get_u32("tokenizer.ggml.padding_token_id"),
            add_bos: g.get_bool("tokenizer.ggml.add_bos_token"),
            add_space_prefix: g.get_bool("tokenizer.ggml.add_space_prefix"),
        })
    }
}

/// Token texts that end generation whatever the metadata says (llama.cpp's list).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
];

fn check_id(name: &str, id: Option<u32>, n: usize) -> Result<Option<u32>, TokenizerError> {
    match id {
        Some(i) if i as usize >= n => Err(TokenizerError::InvalidVocab(format!(
            "{name} token id {i} out of range (vocabulary of {n})"
        ))),
        // A negative id stored as -1 reads as u32::MAX: treated as absent above only if in range.
        other => Ok(other),
    }
}

pub(super) fn build(spec: VocabSpec) -> Result<Tokenizer, TokenizerError> {
    let n = spec.tokens.len();
    if n == 0 {
        return Err(TokenizerError::InvalidVocab("no tokens".into()));
    }
    if n >= u32::MAX as usize {
        return Err(TokenizerError::InvalidVocab(format!("{n} tokens")));
    }
    if !spec.scores.is_empty() && spec.scores.len() != n {
        return Err(TokenizerError::InvalidVocab(format!(
            "{} scores for {n} tokens",
            spec.scores.len()
        )));
    }
    if !spec.token_types.is_empty() && spec.token_types.len() != n {
        return Err(TokenizerError::InvalidVocab(format!(
            "{} token types for {n} tokens",
            spec.token_types.len()
        )));
    }
    let algo = match spec.model.as_str() {
        "gpt2" => {
            let pre = PreTokenizer::from_name(spec.pre.as_deref()).ok_or_else(|| {
                TokenizerError::UnsupportedPreTokenizer(spec.pre.clone().unwrap_or_default())
            })?;
            Algo::Bpe {
                pre,
                ignore_merges: pre == PreTokenizer::Llama3,
            }
        }
        "llama" => Algo::Spm,
        other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
    };
    let types: Vec<TokenType> = if spec.token_types.is_empty() {
        vec![TokenType::Normal; n]
    } else {
        spec.token_types
            .iter()
            .map(|&t| TokenType::from_i32(t))
            .collect()
    };
    let scores = if spec.scores.is_empty() {
        vec![0.0; n]
    } else {
        spec.scores
    };

    let mut token_to_id: HashMap<Box<[u8]>, u32, FxBuild> =
        HashMap::with_capacity_and_hasher(n, FxBuild::default());
    for (i, t) in spec.tokens.iter().enumerate() {
        token_to_id.insert(t.as_bytes().into(), i as u32);
    }

    // Decoded bytes of every token.
    let mut pieces = Vec::with_capacity(n * 6);
    let mut piece_off = Vec::with_capacity(n + 1);
    piece_off.push(0u32);
    for (t, ty) in spec.tokens.iter().zip(&types) {
        match (algo, ty) {
            (_, TokenType::Control | TokenType::Unused) => {}
            (Algo::Bpe { .. }, TokenType::Normal) => {
                for c in t.chars() {
                    match char_to_byte(c) {
                        Some(b) => pieces.push(b),
                        None => pieces.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
            }
            (Algo::Bpe { .. }, TokenType::UserDefined) => pieces.extend_from_slice(t.as_bytes()),
            (Algo::Bpe { .. }, _) => {}
            (_, TokenType::Byte) => match parse_byte_token(t) {
                Some(b) => pieces.push(b),
                None => pieces.extend_from_slice(t.as_bytes()),
            },
            (_, TokenType::Unknown) => pieces.extend_from_slice("▅".as_bytes()),
            (_, _) => pieces.extend_from_slice(t.replace('▁', " ").as_bytes()),
        }
        piece_off.push(pieces.len() as u32);
    }

    // Byte-level BPE: merges and the byte -> token table.
    let mut merges: HashMap<(u32, u32), (u32, u32), FxBuild> = HashMap::default();
    let mut byte_char_token = [None; 256];
    if let Algo::Bpe { .. } = algo {
        let table = byte_to_char_table();
        for (b, c) in table.iter().enumerate() {
            byte_char_token[b] = token_to_id.get(c.to_string().as_bytes()).copied();
        }
        merges.reserve(spec.merges.len());
        for (rank, m) in spec.merges.iter().enumerate() {
            let skip = m.chars().next().map_or(0, char::len_utf8);
            let Some(sp) = m[skip..].find(' ').map(|p| p + skip) else {
                return Err(TokenizerError::InvalidVocab(format!(
                    "merge {rank} '{m}' has no space"
                )));
            };
            let (l, r) = (&m[..sp], &m[sp + 1..]);
            let (Some(&a), Some(&b)) =
                (token_to_id.get(l.as_bytes()), token_to_id.get(r.as_bytes()))
            else {
                continue;
            };
            let merged = format!("{l}{r}");
            let Some(&c) = token_to_id.get(merged.as_bytes()) else {
                continue;
            };
            merges.entry((a, b)).or_insert((rank as u32, c));
        }
    }

    // SPM: byte fallback tokens.
    let mut byte_token = [None; 256];
    if algo == Algo::Spm {
        for (b, slot) in byte_token.iter_mut().enumerate() {
            *slot = token_to_id
                .get(format!("<0x{b:02X}>").as_bytes())
                .copied()
                .or_else(|| token_to_id.get(&[b as u8][..]).copied());
        }
    }

    let bos = check_id("bos", spec.bos, n)?;
    let eos = check_id("eos", spec.eos, n)?;
    let eot = check_id("eot", spec.eot, n)?;
    let eom = check_id("eom", spec.eom, n)?;
    let _ = (
        check_id("unknown", spec.unk, n)?,
        check_id("padding", spec.pad, n)?,
    );

    let mut eog: Vec<u32> = [eos, eot, eom].into_iter().flatten().collect();
    for t in EOG_TEXTS {
        if let Some(&id) = token_to_id.get(t.as_bytes()) {
            eog.push(id);
        }
    }
    eog.sort_unstable();
    eog.dedup();

    let specials = special_list(&spec.tokens, &types);
    let add_bos = spec.add_bos.unwrap_or(algo == Algo::Spm);
    Ok(Tokenizer {
        algo,
        token_to_id,
        scores,
        types,
        pieces,
        piece_off,
        merges,
        byte_char_token,
        byte_token,
        specials,
        bos,
        eos,
        eog,
        add_bos,
        add_space_prefix: spec.add_space_prefix.unwrap_or(true),
        word_sep: if algo == Algo::Spm {
            word_separator(spec.tokens.iter().map(|t| t.as_bytes()), "▁")
        } else {
            None
        },
    })
}

/// `sep` if no token holds it right after a char other than `sep` (so no merge crosses a word start).
fn word_separator<'a>(tokens: impl Iterator<Item = &'a [u8]>, sep: &str) -> Option<Box<[u8]>> {
    let sep = sep.as_bytes();
    for t in tokens {
        let mut at = 1;
        while at + sep.len() <= t.len() {
            if t[at..].starts_with(sep) && !t[..at].ends_with(sep) {
                return None;
            }
            at += 1;
        }
    }
    Some(sep.into())
}

/// Control, user-defined and unknown tokens, longest text first.
fn special_list(tokens: &[String], types: &[TokenType]) -> Vec<(u32, Box<[u8]>, bool)> {
    let mut v: Vec<(u32, Box<[u8]>, bool)> = tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|(_, (t, ty))| {
            !t.is_empty()
                && matches!(
                    ty,
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                )
        })
        .map(|(i, (t, ty))| (i as u32, t.as_bytes().into(), *ty == TokenType::UserDefined))
        .collect();
    v.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
    v
}

fn parse_byte_token(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

pub(super) fn load_llama2c(path: &Path, vocab_size: usize) -> Result<Tokenizer, TokenizerError> {
    let shown = path.display().to_string();
    let data = std::fs::read(path).map_err(|source| TokenizerError::Io {
        path: shown.clone(),
        source,
    })?;
    parse_llama2c(&data, vocab_size, shown)
}

/// Builds a llama2.c tokenizer from the bytes of a `tok*.bin` file (`shown` names it in errors).
pub(super) fn parse_llama2c(
    data: &[u8],
    vocab_size: usize,
    shown: String,
) -> Result<Tokenizer, TokenizerError> {
    let truncated = |entry| TokenizerError::Llama2cTruncated {
        path: shown.clone(),
        entry,
    };
    if data.len() < 4 {
        return Err(truncated(0));
    }
    let mut at = 4; // max_token_length, unused

    // Every entry takes at least 8 bytes: a size the file cannot hold allocates nothing extra.
    let cap = vocab_size.min(data.len() / 8);
    let mut tokens: Vec<Vec<u8>> = Vec::with_capacity(cap);
    let mut scores = Vec::with_capacity(cap);
    for entry in 0..vocab_size {
        let head = data.get(at..at + 8).ok_or_else(|| truncated(entry))?;
        let score = f32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        let len = i32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
        if len < 0 {
            return Err(TokenizerError::InvalidVocab(format!(
                "{shown}: entry {entry} has length {len}"
            )));
        }
        at += 8;
        let bytes = data
            .get(at..at + len as usize)
            .ok_or_else(|| truncated(entry))?;
        at += len as usize;
        tokens.push(bytes.to_vec());
        scores.push(score);
    }

    let n = tokens.len();
    if n < 3 {
        return Err(TokenizerError::InvalidVocab(format!(
            "{shown}: {n} tokens, need at least 3"
        )));
    }
    let mut types = Vec::with_capacity(n);
    let mut token_to_id: HashMap<Box<[u8]>, u32, FxBuild> =
        HashMap::with_capacity_and_hasher(n, FxBuild::default());
    let mut pieces = Vec::new();
    let mut piece_off = vec![0u32];
    let mut byte_token = [None; 256];
    for (i, t) in tokens.iter().enumerate() {
        token_to_id.insert(t.as_slice().into(), i as u32);
        let byte = std::str::from_utf8(t).ok().and_then(parse_byte_token);
        let ty = match (i, byte) {
            (0, _) => TokenType::Unknown,
            (1 | 2, _) => TokenType::Control,
            (_, Some(b)) => {
                byte_token[b as usize].get_or_insert(i as u32);
                pieces.push(b);
                TokenType::Byte
            }
            _ => {
                pieces.extend_from_slice(t);
                TokenType::Normal
            }
        };
        types.push(ty);
        piece_off.push(pieces.len() as u32);
    }
    // llama2.c's byte fallback: byte + 3 when the file has no <0xXX> entry for it.
    for (b, slot) in byte_token.iter_mut().enumerate() {
        if slot.is_none() && b + 3 < n {
            *slot = Some(b as u32 + 3);
        }
    }
    let mut eog = vec![2u32];
    eog.sort_unstable();
    Ok(Tokenizer {
        algo: Algo::Llama2c,
        token_to_id,
        scores,
        types,
        pieces,
        piece_off,
        merges: HashMap::default(),
        byte_char_token: [None; 256],
        byte_token,
        specials: Vec::new(),
        bos: Some(1),
        eos: Some(2),
        eog,
        add_bos: true,
        add_space_prefix: true,
        word_sep: word_separator(tokens.iter().map(Vec::as_slice), " "),
    })
}
