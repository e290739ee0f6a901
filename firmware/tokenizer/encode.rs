//! Encoding: text cut at its literal special tokens, each fragment split by the vocabulary's
//! algorithm and merged (`merge`), in the buffers of an [`EncodeScratch`] so that encoding never
//! allocates; chat prompts with control tokens only from the template's own markers.

use std::collections::BinaryHeap;
use std::fmt;

use super::merge::{HeapEntry, Merge, Sym};
use super::{
    extend_fixed, find, push_fixed, Algo, ChatFormat, ChatMessage, Full, IdSink, TokenType,
    Tokenizer,
};

/// Which buffer of [`Tokenizer::encode_into`] was too small.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodeLimit {
    /// The text is longer (in bytes) than the [`EncodeScratch`] was made for.
    TextBytes,
    /// The ids do not fit in `out`.
    OutputIds,
}

/// Why [`Tokenizer::encode_into`] could not encode a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodeError {
    /// `what` needs `needed` (bytes of text, or ids) but holds only `limit`. For
    /// [`EncodeLimit::OutputIds`], `needed` is the exact number of ids the text encodes to.
    TooLong {
        what: EncodeLimit,
        needed: usize,
        limit: usize,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::TooLong {
                what: EncodeLimit::TextBytes,
                needed,
                limit,
            } => write!(
                f,
                "text of {needed} bytes is longer than the {limit} bytes the encoder scratch holds"
            ),
            EncodeError::TooLong {
                what: EncodeLimit::OutputIds,
                needed,
                limit,
            } => write!(f, "text encodes to {needed} ids, the output holds {limit}"),
        }
    }
}

impl std::error::Error for EncodeError {}

/// Every buffer [`Tokenizer::encode_into`] works in, allocated once for texts of up to
/// `max_text_bytes` bytes (about 95 bytes of memory per byte of text, see [`EncodeScratch::new`]),
/// so that encoding never allocates. One scratch serves any tokenizer.
pub struct EncodeScratch {
    max_text_bytes: usize,
    /// Byte-level BPE: the chars of a text fragment (at most one per byte).
    chars: Vec<char>,
    /// Byte-level BPE: the pre-tokenizer chunk lengths, in chars (at most one per char).
    splits: Vec<u32>,
    /// SentencePiece / llama2.c: a fragment with `▁` for spaces and the prefix space (at most 3
    /// bytes per byte, plus 3); byte-level BPE with `ignore_merges`: a chunk's mapped chars (at
    /// most 2 bytes per byte).
    text: Vec<u8>,
    /// The symbols being merged (at most one per byte, plus the prefix).
    syms: Vec<Sym>,
    /// Pending merges (at most two per symbol: one per initial pair, one more per merge).
    heap: BinaryHeap<HeapEntry>,
    /// Fragments of the text between literal special tokens, and the next pass's (at most one per
    /// byte, plus one).
    frags: Vec<Frag>,
    frags_next: Vec<Frag>,
}

impl fmt::Debug for EncodeScratch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncodeScratch")
            .field("max_text_bytes", &self.max_text_bytes)
            .field("bytes", &self.memory_bytes())
            .finish_non_exhaustive()
    }
}

impl EncodeScratch {
    /// Allocates the buffers for texts of up to `max_text_bytes` bytes: with n =
    /// `max_text_bytes`, n chars (4n bytes), n chunk lengths (4n), 3n + 4 text bytes, n + 2
    /// symbols (20 bytes each), 2n + 4 heap entries (20 bytes each) and twice n + 1 fragments (12
    /// bytes each): about 95n bytes.
    pub fn new(max_text_bytes: usize) -> EncodeScratch {
        let n = max_text_bytes;
        EncodeScratch {
            max_text_bytes: n,
            chars: Vec::with_capacity(n),
            splits: Vec::with_capacity(n),
            text: Vec::with_capacity(3 * n + 4),
            syms: Vec::with_capacity(n + 2),
            heap: BinaryHeap::with_capacity(2 * n + 4),
            frags: Vec::with_capacity(n + 1),
            frags_next: Vec::with_capacity(n + 1),
        }
    }

    /// The longest text (in bytes) this scratch encodes.
    pub fn max_text_bytes(&self) -> usize {
        self.max_text_bytes
    }

    /// The heap memory the scratch holds, in bytes.
    pub fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        self.chars.capacity() * size_of::<char>()
            + self.splits.capacity() * size_of::<u32>()
            + self.text.capacity()
            + self.syms.capacity() * size_of::<Sym>()
            + self.heap.capacity() * size_of::<HeapEntry>()
            + (self.frags.capacity() + self.frags_next.capacity()) * size_of::<Frag>()
    }
}

impl Tokenizer {
    /// Encodes `text`, prepending BOS when `add_bos` (and the vocabulary has one). Control tokens
    /// written in the text are encoded as plain text.
    pub fn encode(&self, text: &str, add_bos: bool) -> Vec<u32> {
        self.encode_with_special(text, add_bos, false)
    }

    /// As [`encode`](Self::encode); with `parse_special`, control tokens written in the text
    /// (`<|im_start|>`, `<|endoftext|>`, ...) become their ids. Allocates a scratch sized for the
    /// text and runs [`encode_into`](Self::encode_into).
    pub fn encode_with_special(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        let mut scratch = EncodeScratch::new(text.len());
        // Byte-level BPE gives at most one id per byte; the rare longer result is encoded again.
        let mut out = vec![0u32; text.len() + 2];
        loop {
            match self.encode_into(text, add_bos, parse_special, &mut scratch, &mut out) {
                Ok(n) => {
                    out.truncate(n);
                    return out;
                }
                Err(EncodeError::TooLong {
                    what: EncodeLimit::OutputIds,
                    needed,
                    ..
                }) => out.resize(needed, 0),
                Err(e) => unreachable!("scratch sized for the text: {e}"),
            }
        }
    }

    /// Renders `messages` in `format` and encodes the prompt as
    /// [`encode_chat_into`](Self::encode_chat_into) does (control tokens only from the template's
    /// markers), in buffers it allocates. Returns the rendered text and its ids.
    pub fn encode_chat(
        &self,
        format: &ChatFormat,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        add_bos: bool,
    ) -> (String, Vec<u32>) {
        let text = format.render(messages, add_generation_prompt);
        let mut scratch = EncodeScratch::new(text.len());
        let mut out = vec![0u32; text.len() + 2];
        loop {
            match self.encode_chat_into(
                format,
                messages,
                add_generation_prompt,
                &text,
                add_bos,
                &mut scratch,
                &mut out,
            ) {
                Ok(n) => {
                    out.truncate(n);
                    return (text, out);
                }
                Err(EncodeError::TooLong {
                    what: EncodeLimit::OutputIds,
                    needed,
                    ..
                }) => out.resize(needed, 0),
                Err(e) => unreachable!("scratch sized for the text: {e}"),
            }
        }
    }

    /// Encodes `text` into `out` without allocating, in the buffers of `scratch`, and returns the
    /// number of ids written (the same ids as
    /// [`encode_with_special`](Self::encode_with_special)). With `add_bos`, BOS comes first (if
    /// the vocabulary has one); with `parse_special`, control tokens written in the text become
    /// their ids.
    ///
    /// Errors: [`EncodeError::TooLong`] when the text is longer than `scratch` was made for
    /// (nothing is encoded), or when the ids do not fit in `out` (then `out` holds the first
    /// `out.len()` ids and `needed` says how many there are).
    pub fn encode_into(
        &self,
        text: &str,
        add_bos: bool,
        parse_special: bool,
        scratch: &mut EncodeScratch,
        out: &mut [u32],
    ) -> Result<usize, EncodeError> {
        Self::bounded(text.len(), scratch, out, |scratch, sink| {
            self.encode_all(text, add_bos, parse_special, scratch, sink)
        })
    }

    /// Runs `encode` for a text of `text_len` bytes into `out`, with the limits and errors of
    /// [`encode_into`](Self::encode_into): the text must fit `scratch`, and the ids `out`.
    fn bounded(
        text_len: usize,
        scratch: &mut EncodeScratch,
        out: &mut [u32],
        encode: impl FnOnce(&mut EncodeScratch, &mut IdSink) -> Result<(), Full>,
    ) -> Result<usize, EncodeError> {
        let too_long_text = EncodeError::TooLong {
            what: EncodeLimit::TextBytes,
            needed: text_len,
            limit: scratch.max_text_bytes,
        };
        // Offsets are u32 (the SentencePiece buffer holds up to 3 bytes per byte).
        if text_len > scratch.max_text_bytes || text_len > (u32::MAX / 4) as usize {
            return Err(too_long_text);
        }
        let limit = out.len();
        let mut sink = IdSink { out, n: 0 };
        encode(scratch, &mut sink).map_err(|Full| too_long_text)?;
        if sink.n > limit {
            return Err(EncodeError::TooLong {
                what: EncodeLimit::OutputIds,
                needed: sink.n,
                limit,
            });
        }
        Ok(sink.n)
    }

    /// Encodes a chat prompt: `rendered` is what [`ChatFormat::render_into`] wrote for
    /// `messages` and `add_generation_prompt`. Only the template's own markers (`<|im_start|>`,
    /// `<|im_end|>`, `<|eot_id|>`, ...) become control tokens; roles and message contents are
    /// encoded as plain text, so `<|im_end|>` written in a message is its characters and a client
    /// cannot forge a turn. Ids, limits and errors as [`encode_into`](Self::encode_into) (for a
    /// conversation whose contents hold no control-token text, the same ids as `encode_into` of
    /// `rendered` with `parse_special`); no allocation.
    ///
    /// If `rendered` is not the rendering of `messages` (a caller's mistake), it is encoded
    /// whole as plain text: never with control tokens taken from it.
    #[allow(clippy::too_many_arguments)]
    pub fn encode_chat_into(
        &self,
        format: &ChatFormat,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        rendered: &str,
        add_bos: bool,
        scratch: &mut EncodeScratch,
        out: &mut [u32],
    ) -> Result<usize, EncodeError> {
        let mut pos = 0;
        let mut same = true;
        format.walk(messages, add_generation_prompt, &mut |piece, _| {
            same =
                same && rendered.as_bytes().get(pos..pos + piece.len()) == Some(piece.as_bytes());
            pos += piece.len();
        });
        if !same || pos != rendered.len() {
            return self.encode_into(rendered, add_bos, false, scratch, out);
        }
        Self::bounded(rendered.len(), scratch, out, |scratch, sink| {
            if add_bos {
                if let Some(b) = self.bos {
                    sink.push(b);
                }
            }
            // The text between two markers that are control tokens is encoded as one fragment, as
            // `encode_into` would cut it (a marker the vocabulary lacks stays part of the text).
            let mut prev_special = true;
            let mut text_start = 0;
            let mut pos = 0;
            let mut result = Ok(());
            format.walk(messages, add_generation_prompt, &mut |piece, marker| {
                let start = pos;
                pos += piece.len();
                if !marker || result.is_err() {
                    return;
                }
                let Some(id) = self.control_id(piece) else {
                    return;
                };
                result = self.encode_fragments(
                    &rendered[text_start..start],
                    false,
                    &mut prev_special,
                    scratch,
                    sink,
                );
                sink.push(id);
                prev_special = true;
                text_start = pos;
            });
            result.and_then(|()| {
                self.encode_fragments(
                    &rendered[text_start..],
                    false,
                    &mut prev_special,
                    scratch,
                    sink,
                )
            })
        })
    }

    /// The id of the token whose text is `marker`, if it is one that `parse_special` matches
    /// (control, user-defined or unknown).
    fn control_id(&self, marker: &str) -> Option<u32> {
        let id = self.lookup(marker.as_bytes())?;
        matches!(
            self.token_type(id)?,
            TokenType::Control | TokenType::UserDefined | TokenType::Unknown
        )
        .then_some(id)
    }

    fn encode_all(
        &self,
        text: &str,
        add_bos: bool,
        parse_special: bool,
        scratch: &mut EncodeScratch,
        out: &mut IdSink,
    ) -> Result<(), Full> {
        if add_bos {
            if let Some(b) = self.bos {
                out.push(b);
            }
        }
        self.encode_fragments(text, parse_special, &mut true, scratch, out)
    }

    /// Encodes `text` cut at its literal special tokens (control ones only with
    /// `parse_special`); `prev_special` says whether a special token (or the start) comes right
    /// before, and is updated.
    fn encode_fragments(
        &self,
        text: &str,
        parse_special: bool,
        prev_special: &mut bool,
        scratch: &mut EncodeScratch,
        out: &mut IdSink,
    ) -> Result<(), Full> {
        self.partition(
            text.as_bytes(),
            parse_special,
            &mut scratch.frags,
            &mut scratch.frags_next,
        )?;
        for &frag in &scratch.frags {
            match frag {
                Frag::Token(id) => {
                    out.push(id);
                    *prev_special = true;
                }
                Frag::Text { start, end } => {
                    // Fragments are cut around valid UTF-8 tokens, so at char boundaries.
                    let s = text.get(start as usize..end as usize).ok_or(Full)?;
                    self.encode_text(
                        s,
                        *prev_special,
                        &mut scratch.chars,
                        &mut scratch.splits,
                        &mut scratch.text,
                        &mut Merge {
                            syms: &mut scratch.syms,
                            heap: &mut scratch.heap,
                        },
                        out,
                    )?;
                    *prev_special = false;
                }
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn encode_text(
        &self,
        text: &str,
        prev_special: bool,
        chars: &mut Vec<char>,
        splits: &mut Vec<u32>,
        buf: &mut Vec<u8>,
        work: &mut Merge,
        out: &mut IdSink,
    ) -> Result<(), Full> {
        match self.algo {
            Algo::Bpe { pre, ignore_merges } => {
                chars.clear();
                for c in text.chars() {
                    push_fixed(chars, c)?;
                }
                splits.clear();
                pre.split_into(chars, splits)?;
                let mut byte_at = 0;
                let mut char_at = 0;
                for &len in splits.iter() {
                    let len = len as usize;
                    let nbytes: usize = chars[char_at..char_at + len]
                        .iter()
                        .map(|c| c.len_utf8())
                        .sum();
                    self.bpe_word(
                        &text.as_bytes()[byte_at..byte_at + nbytes],
                        ignore_merges,
                        buf,
                        work,
                        out,
                    )?;
                    char_at += len;
                    byte_at += nbytes;
                }
            }
            Algo::Spm => {
                buf.clear();
                if self.add_space_prefix && prev_special {
                    extend_fixed(buf, "▁".as_bytes())?;
                }
                let mut utf8 = [0u8; 4];
                for c in text.chars() {
                    let c = if c == ' ' { '▁' } else { c };
                    extend_fixed(buf, c.encode_utf8(&mut utf8).as_bytes())?;
                }
                self.score_merge(buf, work, out)?;
            }
            Algo::Llama2c => {
                buf.clear();
                if prev_special && !text.is_empty() {
                    extend_fixed(buf, b" ")?;
                }
                extend_fixed(buf, text.as_bytes())?;
                self.score_merge(buf, work, out)?;
            }
        }
        Ok(())
    }

    /// Splits text into raw fragments and literal special tokens, longest token first (as llama.cpp's
    /// `tokenizer_st_partition`), into `frags` (`next`: room for a pass).
    fn partition(
        &self,
        text: &[u8],
        parse_special: bool,
        frags: &mut Vec<Frag>,
        next: &mut Vec<Frag>,
    ) -> Result<(), Full> {
        frags.clear();
        if !text.is_empty() {
            push_fixed(
                frags,
                Frag::Text {
                    start: 0,
                    end: text.len() as u32,
                },
            )?;
        }
        for (id, tok, user_defined) in &self.specials {
            if !parse_special && !user_defined {
                continue;
            }
            if tok.is_empty() {
                continue;
            }
            next.clear();
            for &f in frags.iter() {
                match f {
                    Frag::Token(_) => push_fixed(next, f)?,
                    Frag::Text { start, end } => {
                        let (mut start, end) = (start as usize, end as usize);
                        while let Some(p) = find(&text[start..end], tok) {
                            if p > 0 {
                                push_fixed(
                                    next,
                                    Frag::Text {
                                        start: start as u32,
                                        end: (start + p) as u32,
                                    },
                                )?;
                            }
                            push_fixed(next, Frag::Token(*id))?;
                            start += p + tok.len();
                        }
                        if start < end {
                            push_fixed(
                                next,
                                Frag::Text {
                                    start: start as u32,
                                    end: end as u32,
                                },
                            )?;
                        }
                    }
                }
            }
            std::mem::swap(frags, next);
        }
        Ok(())
    }
}

/// A piece of the text to encode: raw text (byte offsets) or a literal special token.
#[derive(Clone, Copy)]
enum Frag {
    Text { start: u32, end: u32 },
    Token(u32),
}
