//! Tokenizers: byte-level BPE (GPT-2 style, `tokenizer.ggml.model = "gpt2"`), SentencePiece-style BPE
//! (`"llama"`), llama2.c `tok*.bin` vocabularies, and chat templates ([`chat`]).
//!
//! The algorithms follow llama.cpp (src/llama-vocab.cpp, src/unicode.cpp) so that token ids agree
//! with its conformance vectors:
//! - byte-level BPE: text is split into chunks by the pre-tokenizer selected by
//!   `tokenizer.ggml.pre` ([`PreTokenizer`]), each chunk's bytes are mapped to chars by the GPT-2
//!   byte->unicode map and merged pairwise by merge rank (lowest first, leftmost on ties);
//! - SentencePiece BPE: spaces become `▁`, one `▁` is prepended (`add_space_prefix`), chars are
//!   merged pairwise by the highest score of the merged piece, and chars left without a token fall
//!   back to `<0xXX>` byte tokens;
//! - llama2.c: the same score-driven merge with a dummy-prefix space and no `▁` escaping.
//!
//! Control tokens (`<|im_start|>`, `<s>`, ...) in text are parsed as such only when asked
//! ([`Tokenizer::encode_with_special`]); user-defined tokens are always matched, as in llama.cpp.

pub mod chat;
mod pretok;
mod unicode;
mod unicode_tables;
mod vocab;

pub use chat::{ChatFormat, ChatMessage};
pub use pretok::PreTokenizer;
pub use vocab::{TokenType, VocabSpec};

use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::path::Path;

use vocab::FxBuild;

/// Why a tokenizer could not be built or a chat template not used.
#[derive(Debug)]
pub enum TokenizerError {
    /// A required GGUF key is absent or of the wrong type.
    MissingKey(&'static str),
    /// `tokenizer.ggml.model` names a tokenizer this crate does not implement.
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    UnsupportedPreTokenizer(String),
    /// The vocabulary is inconsistent (array lengths, ids out of range, ...).
    InvalidVocab(String),
    /// A llama2.c tokenizer file ended inside entry `entry` (0-based), or before its header.
    Llama2cTruncated { path: String, entry: usize },
    /// A file could not be read.
    Io {
        path: String,
        source: std::io::Error,
    },
    /// `tokenizer.chat_template` is not one of the formats [`ChatFormat`] knows.
    UnsupportedChatTemplate(String),
}

impl fmt::Display for TokenizerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenizerError::MissingKey(k) => {
                write!(f, "tokenizer key '{k}' missing or of the wrong type")
            }
            TokenizerError::UnsupportedModel(m) => write!(f, "unsupported tokenizer model '{m}'"),
            TokenizerError::UnsupportedPreTokenizer(p) => {
                write!(f, "unsupported pre-tokenizer '{p}'")
            }
            TokenizerError::InvalidVocab(why) => write!(f, "invalid tokenizer vocabulary: {why}"),
            TokenizerError::Llama2cTruncated { path, entry } => {
                write!(
                    f,
                    "llama2.c tokenizer file {path} truncated at entry {entry}"
                )
            }
            TokenizerError::Io { path, source } => {
                write!(f, "cannot read tokenizer file {path}: {source}")
            }
            TokenizerError::UnsupportedChatTemplate(t) => {
                write!(f, "chat template not supported: {t}")
            }
        }
    }
}

impl std::error::Error for TokenizerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TokenizerError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Which merge algorithm the vocabulary uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algo {
    /// Byte-level BPE with ranked merges.
    Bpe {
        pre: PreTokenizer,
        ignore_merges: bool,
    },
    /// SentencePiece BPE by score, with `▁` for spaces.
    Spm,
    /// llama2.c: BPE by score on raw text with a dummy-prefix space.
    Llama2c,
}

/// A loaded vocabulary with its encoder and decoder.
pub struct Tokenizer {
    algo: Algo,
    /// Token text as stored in the vocabulary -> id (the last id wins on duplicates, as in llama.cpp).
    token_to_id: HashMap<Box<[u8]>, u32, FxBuild>,
    scores: Vec<f32>,
    types: Vec<TokenType>,
    /// Decoded bytes of every token: `pieces[piece_off[i]..piece_off[i + 1]]`.
    pieces: Vec<u8>,
    piece_off: Vec<u32>,
    /// Byte-level BPE: (left id, right id) -> (rank, merged id).
    merges: HashMap<(u32, u32), (u32, u32), FxBuild>,
    /// Byte-level BPE: the token of each byte's mapped char.
    byte_char_token: [Option<u32>; 256],
    /// SPM / llama2.c: the `<0xXX>` token of each byte.
    byte_token: [Option<u32>; 256],
    /// Tokens matched literally in text: (id, text, is user-defined), longest text first.
    specials: Vec<(u32, Box<[u8]>, bool)>,
    bos: Option<u32>,
    eos: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    add_space_prefix: bool,
    /// SPM / llama2.c: the word separator at which text may be cut before merging (see
    /// `score_merge`), if the vocabulary allows it.
    word_sep: Option<Box<[u8]>>,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("algo", &self.algo)
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

/// An `f32` ordered totally, for the score heap.
#[derive(PartialEq, Clone, Copy)]
struct Score(f32);
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    len: usize,
    prev: usize,
    next: usize,
    id: u32,
}

const NONE: usize = usize::MAX;
const NO_ID: u32 = u32::MAX;

/// A pending byte-level BPE merge: (rank, left, right, left id, right id), smallest first.
type RankEntry = std::cmp::Reverse<(u32, usize, usize, u32, u32)>;

impl Tokenizer {
    /// Builds the tokenizer of a GGUF file's `tokenizer.*` metadata.
    pub fn from_gguf(g: &crate::model::gguf::Gguf) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_spec(VocabSpec::from_gguf(g)?)
    }

    /// Builds the tokenizer from plain vocabulary data (what `from_gguf` reads).
    pub fn from_spec(spec: VocabSpec) -> Result<Tokenizer, TokenizerError> {
        vocab::build(spec)
    }

    /// Loads a llama2.c tokenizer file (`tok*.bin`: i32 max_token_length, then per token an f32
    /// score, an i32 byte length and the bytes) with `vocab_size` entries.
    pub fn from_llama2c(path: &Path, vocab_size: usize) -> Result<Tokenizer, TokenizerError> {
        vocab::load_llama2c(path, vocab_size)
    }

    /// Encodes `text`, prepending BOS when `add_bos` (and the vocabulary has one). Control tokens
    /// written in the text are encoded as plain text.
    pub fn encode(&self, text: &str, add_bos: bool) -> Vec<u32> {
        self.encode_with_special(text, add_bos, false)
    }

    /// As [`encode`](Self::encode); with `parse_special`, control tokens written in the text
    /// (`<|im_start|>`, `<|endoftext|>`, ...) become their ids.
    pub fn encode_with_special(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            if let Some(b) = self.bos {
                out.push(b);
            }
        }
        let mut prev_special = true;
        for frag in self.partition(text.as_bytes(), parse_special) {
            match frag {
                Frag::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Frag::Text(bytes) => {
                    // Fragments are split at token boundaries of valid UTF-8 tokens, so stay UTF-8.
                    let s = std::str::from_utf8(bytes).expect("fragment of a str");
                    self.encode_text(s, prev_special, &mut out);
                    prev_special = false;
                }
            }
        }
        out
    }

    fn encode_text(&self, text: &str, prev_special: bool, out: &mut Vec<u32>) {
        match self.algo {
            Algo::Bpe { pre, ignore_merges } => {
                let chars: Vec<char> = text.chars().collect();
                let mut byte_at = 0;
                let mut char_at = 0;
                for len in pre.split(&chars) {
                    let nbytes: usize = chars[char_at..char_at + len]
                        .iter()
                        .map(|c| c.len_utf8())
                        .sum();
                    self.bpe_word(
                        &text.as_bytes()[byte_at..byte_at + nbytes],
                        ignore_merges,
                        out,
                    );
                    char_at += len;
                    byte_at += nbytes;
                }
            }
            Algo::Spm => {
                let mut s = String::with_capacity(text.len() + 8);
                if self.add_space_prefix && prev_special {
                    s.push('▁');
                }
                for c in text.chars() {
                    if c == ' ' {
                        s.push('▁');
                    } else {
                        s.push(c);
                    }
                }
                self.score_merge(s.as_bytes(), out);
            }
            Algo::Llama2c => {
                let mut s = Vec::with_capacity(text.len() + 1);
                if prev_special && !text.is_empty() {
                    s.push(b' ');
                }
                s.extend_from_slice(text.as_bytes());
                self.score_merge(&s, out);
            }
        }
    }

    fn lookup(&self, bytes: &[u8]) -> Option<u32> {
        self.token_to_id.get(bytes).copied()
    }

    /// Byte-level BPE of one pre-tokenizer chunk.
    fn bpe_word(&self, word: &[u8], ignore_merges: bool, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if ignore_merges {
            let table = unicode::byte_to_char_table();
            let mapped: String = word.iter().map(|&b| table[b as usize]).collect();
            if let Some(id) = self.lookup(mapped.as_bytes()) {
                out.push(id);
                return;
            }
        }
        if word.len() == 1 {
            if let Some(id) = self.byte_char_token[word[0] as usize] {
                out.push(id);
            }
            return;
        }
        let n = word.len();
        let mut syms: Vec<Sym> = (0..n)
            .map(|i| Sym {
                start: i,
                len: 1,
                prev: if i == 0 { NONE } else { i - 1 },
                next: if i + 1 == n { NONE } else { i + 1 },
                id: self.byte_char_token[word[i] as usize].unwrap_or(NO_ID),
            })
            .collect();
        // Min-heap on (rank, left): entries (rank, left, right, left id, right id).
        let mut heap: BinaryHeap<RankEntry> = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<_>, syms: &[Sym], l: usize, r: usize| {
            if l == NONE || r == NONE {
                return;
            }
            let (a, b) = (syms[l].id, syms[r].id);
            if a == NO_ID || b == NO_ID {
                return;
            }
            if let Some(&(rank, _)) = self.merges.get(&(a, b)) {
                heap.push(std::cmp::Reverse((rank, l, r, a, b)));
            }
        };
        for i in 1..n {
            push(&mut heap, &syms, i - 1, i);
        }
        while let Some(std::cmp::Reverse((_, l, r, a, b))) = heap.pop() {
            if syms[l].len == 0
                || syms[r].len == 0
                || syms[l].id != a
                || syms[r].id != b
                || syms[l].next != r
            {
                continue;
            }
            let merged = self.merges[&(a, b)].1;
            syms[l].len += syms[r].len;
            syms[l].id = merged;
            syms[r].len = 0;
            let rn = syms[r].next;
            syms[l].next = rn;
            if rn != NONE {
                syms[rn].prev = l;
            }
            let lp = syms[l].prev;
            push(&mut heap, &syms, lp, l);
            push(&mut heap, &syms, l, rn);
        }
        let mut i = 0;
        while i != NONE {
            if syms[i].id != NO_ID {
                out.push(syms[i].id);
            }
            i = syms[i].next;
        }
    }

    /// Score-driven BPE (SentencePiece, llama2.c) over the chars of `text`. When no token holds the
    /// word separator (`▁`, or ' ' for llama2.c) after another char, no merge can cross the start
    /// of a word, so each word is merged on its own (same result, a small heap per word).
    fn score_merge(&self, text: &[u8], out: &mut Vec<u32>) {
        let Some(sep) = self.word_sep.as_deref() else {
            return self.score_merge_span(text, out);
        };
        let mut start = 0;
        let mut at = 0;
        while let Some(p) = find(&text[at..], sep) {
            let pos = at + p;
            if pos > start && !text[..pos].ends_with(sep) {
                self.score_merge_span(&text[start..pos], out);
                start = pos;
            }
            at = pos + sep.len();
        }
        self.score_merge_span(&text[start..], out);
    }

    fn score_merge_span(&self, text: &[u8], out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
        let mut off = 0;
        while off < text.len() {
            let lead = text[off];
            let clen = match lead >> 4 {
                0xC | 0xD => 2,
                0xE => 3,
                0xF => 4,
                _ => 1,
            }
            .min(text.len() - off);
            let idx = syms.len();
            syms.push(Sym {
                start: off,
                len: clen,
                prev: if idx == 0 { NONE } else { idx - 1 },
                next: idx + 1,
                id: NO_ID,
            });
            off += clen;
        }
        let last = syms.len() - 1;
        syms[last].next = NONE;
        // Max-heap on (score, -left): entries (score, Reverse(left), right, merged length).
        let mut heap: BinaryHeap<(Score, std::cmp::Reverse<usize>, usize, usize)> =
            BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<_>, syms: &[Sym], l: usize, r: usize| {
            if l == NONE || r == NONE {
                return;
            }
            let span = &text[syms[l].start..syms[r].start + syms[r].len];
            if let Some(id) = self.lookup(span) {
                heap.push((
                    Score(self.scores[id as usize]),
                    std::cmp::Reverse(l),
                    r,
                    span.len(),
                ));
            }
        };
        for i in 1..syms.len() {
            push(&mut heap, &syms, i - 1, i);
        }
        while let Some((_, std::cmp::Reverse(l), r, size)) = heap.pop() {
            if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != size {
                continue;
            }
            syms[l].len += syms[r].len;
            syms[r].len = 0;
            let rn = syms[r].next;
            syms[l].next = rn;
            if rn != NONE {
                syms[rn].prev = l;
            }
            let lp = syms[l].prev;
            push(&mut heap, &syms, lp, l);
            push(&mut heap, &syms, l, rn);
        }
        let mut i = 0;
        while i != NONE {
            let s = syms[i];
            let span = &text[s.start..s.start + s.len];
            match self.lookup(span) {
                Some(id) => out.push(id),
                None => {
                    for &b in span {
                        if let Some(id) = self.byte_token[b as usize] {
                            out.push(id);
                        }
                    }
                }
            }
            i = s.next;
        }
    }

    /// Splits text into raw fragments and literal special tokens, longest token first (as llama.cpp's
    /// `tokenizer_st_partition`).
    fn partition<'t>(&self, text: &'t [u8], parse_special: bool) -> Vec<Frag<'t>> {
        let mut frags = if text.is_empty() {
            Vec::new()
        } else {
            vec![Frag::Text(text)]
        };
        for (id, tok, user_defined) in &self.specials {
            if !parse_special && !user_defined {
                continue;
            }
            if tok.is_empty() {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                match f {
                    Frag::Token(_) => next.push(f),
                    Frag::Text(mut t) => {
                        while let Some(p) = find(t, tok) {
                            if p > 0 {
                                next.push(Frag::Text(&t[..p]));
                            }
                            next.push(Frag::Token(*id));
                            t = &t[p + tok.len()..];
                        }
                        if !t.is_empty() {
                            next.push(Frag::Text(t));
                        }
                    }
                }
            }
            frags = next;
        }
        frags
    }

    /// The bytes token `id` decodes to: byte-level BPE tokens undo the GPT-2 byte map, SentencePiece
    /// tokens turn `▁` into spaces and `<0xAB>` into the byte 0xAB; control and unused tokens (and
    /// ids out of range) decode to no bytes.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i + 1 >= self.piece_off.len() {
            return &[];
        }
        &self.pieces[self.piece_off[i] as usize..self.piece_off[i + 1] as usize]
    }

    /// Decodes `ids` to text (invalid UTF-8 replaced by U+FFFD). For SentencePiece and llama2.c
    /// vocabularies the one space the encoder prepends is stripped from the first text token when it
    /// is at the start or right after a leading BOS.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        let strip = match self.algo {
            Algo::Spm => self.add_space_prefix,
            Algo::Llama2c => true,
            Algo::Bpe { .. } => false,
        };
        for (k, &id) in ids.iter().enumerate() {
            let mut piece = self.token_bytes(id);
            let first_text = k == 0 || (k == 1 && Some(ids[0]) == self.bos);
            if strip && first_text && piece.first() == Some(&b' ') {
                piece = &piece[1..];
            }
            bytes.extend_from_slice(piece);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The beginning-of-sequence token, if the vocabulary has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token, if the vocabulary has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether generation stops at `id`: EOS, EOT/EOM, and the tokens llama.cpp treats so by their
    /// text (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<|end|>`, `<end_of_turn>`, ...).
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Whether the model expects BOS at the start of a prompt (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos_default(&self) -> bool {
        self.add_bos
    }

    /// The number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.types.len()
    }

    /// The id of the token whose vocabulary text is `text` (as stored: e.g. `<|im_end|>`, or `Ġthe`
    /// in byte-level BPE, `▁the` in SentencePiece).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.lookup(text.as_bytes())
    }

    /// The type of token `id` (normal, control, byte, ...).
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }
}

enum Frag<'t> {
    Text(&'t [u8]),
    Token(u32),
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.len() > hay.len() {
        return None;
    }
    let first = needle[0];
    let mut i = 0;
    while i + needle.len() <= hay.len() {
        match hay[i..=hay.len() - needle.len()]
            .iter()
            .position(|&b| b == first)
        {
            None => return None,
            Some(p) => {
                i += p;
                if &hay[i..i + needle.len()] == needle {
                    return Some(i);
                }
                i += 1;
            }
        }
    }
    None
}
