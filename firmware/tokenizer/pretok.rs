//! Pre-tokenizers of byte-level BPE vocabularies: hand-written equivalents of the regexes llama.cpp
//! selects by `tokenizer.ggml.pre` (src/llama-vocab.cpp), following its custom splitters in
//! src/unicode.cpp so that the chunk boundaries agree exactly.

use super::unicode::{is_letter, is_number, is_whitespace};
use super::Full;

/// The pre-tokenizer variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)` (GPT-2, the default).
    Gpt2,
    /// `\p{N}` first (every digit alone), then the GPT-2 regex (SmolLM, StarCoder).
    Smollm,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    /// (Llama 3).
    Llama3,
    /// As Llama 3 but `\p{N}` (one digit per chunk) instead of `\p{N}{1,3}` (Qwen2).
    Qwen2,
}

impl PreTokenizer {
    /// The variant for a `tokenizer.ggml.pre` value (`None`: key absent).
    pub fn from_name(name: Option<&str>) -> Option<PreTokenizer> {
        Some(match name.unwrap_or("default") {
            "default" | "gpt-2" | "gpt2" => PreTokenizer::Gpt2,
            "smollm" | "starcoder" | "refact" => PreTokenizer::Smollm,
            "llama-bpe" | "llama3" => PreTokenizer::Llama3,
            "qwen2" => PreTokenizer::Qwen2,
            _ => return None,
        })
    }

    /// Splits `text` into chunks (lengths in chars, summing to `chars.len()`).
    pub fn split(self, chars: &[char]) -> Vec<usize> {
        // At most one chunk per char, so `split_into` cannot run out of room.
        let mut out = Vec::with_capacity(chars.len());
        let _ = self.split_into(chars, &mut out);
        out.into_iter().map(|len| len as usize).collect()
    }

    /// As [`split`](Self::split), appending the chunk lengths to `out` without ever growing it:
    /// `Err(Full)` when `out` has no spare capacity for a chunk (a capacity of `chars.len()`
    /// always suffices, every chunk holding at least one char).
    pub(crate) fn split_into(self, chars: &[char], out: &mut Vec<u32>) -> Result<(), Full> {
        match self {
            PreTokenizer::Gpt2 => split_gpt2(chars, out),
            PreTokenizer::Smollm => {
                let mut start = 0;
                while start < chars.len() {
                    let end = if is_number(chars[start]) {
                        start + 1
                    } else {
                        let mut e = start;
                        while e < chars.len() && !is_number(chars[e]) {
                            e += 1;
                        }
                        e
                    };
                    split_gpt2(&chars[start..end], out)?;
                    start = end;
                }
                Ok(())
            }
            PreTokenizer::Llama3 => split_llama3(chars, 3, out),
            PreTokenizer::Qwen2 => split_llama3(chars, 1, out),
        }
    }
}

#[derive(Clone, Copy, Default)]
struct Flags {
    in_range: bool,
    letter: bool,
    number: bool,
    space: bool,
}

fn flags_at(cs: &[char], pos: usize) -> Flags {
    match cs.get(pos) {
        None => Flags::default(),
        Some(&c) => Flags {
            in_range: true,
            letter: is_letter(c),
            number: is_number(c),
            space: is_whitespace(c),
        },
    }
}

fn is_other(f: Flags) -> bool {
    f.in_range && !(f.space || f.letter || f.number)
}

fn contraction_len(cs: &[char], pos: usize, case_insensitive: bool) -> usize {
    if cs[pos] != '\'' || pos + 1 >= cs.len() {
        return 0;
    }
    let low = |c: char| {
        if case_insensitive {
            c.to_ascii_lowercase()
        } else {
            c
        }
    };
    let next = low(cs[pos + 1]);
    if matches!(next, 's' | 't' | 'm' | 'd') {
        return 2;
    }
    if pos + 2 < cs.len() {
        let nn = low(cs[pos + 2]);
        if matches!((next, nn), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
            return 3;
        }
    }
    0
}

struct Emitter<'a> {
    out: &'a mut Vec<u32>,
    prev_end: usize,
    full: bool,
}

impl Emitter<'_> {
    fn add(&mut self, end: usize) {
        if end > self.prev_end {
            if self.out.len() < self.out.capacity() {
                self.out.push((end - self.prev_end) as u32);
            } else {
                self.full = true;
            }
        }
        self.prev_end = end;
    }

    fn finish(self) -> Result<(), Full> {
        if self.full {
            Err(Full)
        } else {
            Ok(())
        }
    }
}

fn split_gpt2(cs: &[char], out: &mut Vec<u32>) -> Result<(), Full> {
    let mut em = Emitter {
        out,
        prev_end: 0,
        full: false,
    };
    let n = cs.len();
    let mut pos = 0;
    while pos < n {
        let cpt = cs[pos];
        let k = contraction_len(cs, pos, false);
        if k > 0 {
            pos += k;
            em.add(pos);
            continue;
        }
        let flags = flags_at(cs, pos);
        let mut flags2 = if cpt == ' ' {
            flags_at(cs, pos + 1)
        } else {
            flags
        };
        if flags2.letter {
            pos += (cpt == ' ') as usize;
            while flags2.letter {
                pos += 1;
                flags2 = flags_at(cs, pos);
            }
            em.add(pos);
            continue;
        }
        if flags2.number {
            pos += (cpt == ' ') as usize;
            while flags2.number {
                pos += 1;
                flags2 = flags_at(cs, pos);
            }
            em.add(pos);
            continue;
        }
        if is_other(flags2) {
            pos += (cpt == ' ') as usize;
            while is_other(flags2) {
                pos += 1;
                flags2 = flags_at(cs, pos);
            }
            em.add(pos);
            continue;
        }
        let mut num_ws = 0;
        while flags_at(cs, pos + num_ws).space {
            num_ws += 1;
        }
        if num_ws > 1 && pos + num_ws < n {
            pos += num_ws - 1;
            em.add(pos);
            continue;
        }
        if num_ws > 0 {
            pos += num_ws;
            em.add(pos);
            continue;
        }
        pos += 1;
        em.add(pos);
    }
    em.finish()
}

fn split_llama3(cs: &[char], max_digits: usize, out: &mut Vec<u32>) -> Result<(), Full> {
    let mut em = Emitter {
        out,
        prev_end: 0,
        full: false,
    };
    let n = cs.len();
    let mut pos = 0;
    while pos < n {
        let cpt = cs[pos];
        let flags = flags_at(cs, pos);
        let k = contraction_len(cs, pos, true);
        if k > 0 {
            pos += k;
            em.add(pos);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(cpt == '\r' || cpt == '\n' || flags.number)
            && (flags.letter || flags_at(cs, pos + 1).letter)
        {
            pos += 1;
            while flags_at(cs, pos).letter {
                pos += 1;
            }
            em.add(pos);
            continue;
        }
        // \p{N}{1,max_digits}
        if flags.number {
            let mut ini = pos;
            while flags_at(cs, pos).number {
                pos += 1;
                if pos - ini >= max_digits {
                    em.add(pos);
                    ini = pos;
                }
            }
            em.add(pos);
            continue;
        }
        // <space>?[^\s\p{L}\p{N}]+[\r\n]*
        let mut flags2 = if cpt == ' ' {
            flags_at(cs, pos + 1)
        } else {
            flags
        };
        if is_other(flags2) {
            pos += (cpt == ' ') as usize;
            while is_other(flags2) {
                pos += 1;
                flags2 = flags_at(cs, pos);
            }
            while pos < n && (cs[pos] == '\r' || cs[pos] == '\n') {
                pos += 1;
            }
            em.add(pos);
            continue;
        }
        let mut num_ws = 0;
        let mut last_end_rn = 0;
        while flags_at(cs, pos + num_ws).space {
            let c2 = cs[pos + num_ws];
            if c2 == '\r' || c2 == '\n' {
                last_end_rn = pos + num_ws + 1;
            }
            num_ws += 1;
        }
        // \s*[\r\n]+
        if last_end_rn > 0 {
            pos = last_end_rn;
            em.add(pos);
            continue;
        }
        // \s+(?!\S)
        if num_ws > 1 && pos + num_ws < n {
            pos += num_ws - 1;
            em.add(pos);
            continue;
        }
        // \s+
        if num_ws > 0 {
            pos += num_ws;
            em.add(pos);
            continue;
        }
        pos += 1;
        em.add(pos);
    }
    em.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(p: PreTokenizer, s: &str) -> Vec<String> {
        let cs: Vec<char> = s.chars().collect();
        let mut at = 0;
        p.split(&cs)
            .into_iter()
            .map(|len| {
                let w: String = cs[at..at + len].iter().collect();
                at += len;
                w
            })
            .collect()
    }

    #[test]
    fn gpt2_chunks() {
        assert_eq!(
            chunks(PreTokenizer::Gpt2, "Hello, y'all!  How 123"),
            ["Hello", ",", " y", "'", "all", "!", " ", " How", " 123"]
        );
        assert_eq!(chunks(PreTokenizer::Gpt2, "a   "), ["a", "   "]);
        assert_eq!(chunks(PreTokenizer::Gpt2, "I'M"), ["I", "'", "M"]);
    }

    #[test]
    fn llama3_and_qwen2_chunks() {
        assert_eq!(
            chunks(PreTokenizer::Llama3, "I'M 12345\n\n x"),
            ["I", "'M", " ", "123", "45", "\n\n", " x"]
        );
        assert_eq!(
            chunks(PreTokenizer::Qwen2, "ab 123!!\n"),
            ["ab", " ", "1", "2", "3", "!!\n"]
        );
    }

    #[test]
    fn smollm_splits_digits_first() {
        assert_eq!(
            chunks(PreTokenizer::Smollm, "a 33 b"),
            ["a", " ", "3", "3", " b"]
        );
    }
}
