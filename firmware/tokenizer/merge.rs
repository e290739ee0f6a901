//! The two BPE merges over a doubly linked list of symbols and a heap of pending merges:
//! byte-level BPE by merge rank, SentencePiece / llama2.c BPE by the score of the merged piece.

use std::collections::BinaryHeap;

use super::unicode;
use super::{extend_fixed, find, push_fixed, Full, IdSink, Tokenizer};

#[derive(Clone, Copy)]
pub(super) struct Sym {
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
    id: u32,
}

const NONE: u32 = u32::MAX;
const NO_ID: u32 = u32::MAX;

/// Merges symbol `l` with its right neighbour in the linked list (the neighbour is emptied and
/// unlinked); returns the new right neighbour of `l`. Both BPE variants merge this way.
fn absorb_right(syms: &mut [Sym], l: u32) -> u32 {
    let li = l as usize;
    let ri = syms[li].next as usize;
    syms[li].len += syms[ri].len;
    syms[ri].len = 0;
    let rn = syms[ri].next;
    syms[li].next = rn;
    if rn != NONE {
        syms[rn as usize].prev = l;
    }
    rn
}

/// A pending merge, smallest first. Byte-level BPE: (rank, left, right, left id, right id), the
/// lowest rank, leftmost on ties. Score BPE: (!score key, left, !right, !merged length, 0), the
/// highest score (in `f32::total_cmp` order), leftmost on ties.
pub(super) type HeapEntry = std::cmp::Reverse<(u32, u32, u32, u32, u32)>;

/// `x` as a u32 ordered as `f32::total_cmp` orders the floats.
fn score_key(x: f32) -> u32 {
    let bits = x.to_bits();
    // Negative floats: all bits flipped (larger magnitude sorts lower); others: sign bit set.
    if bits >> 31 == 1 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

impl Tokenizer {
    /// Byte-level BPE of one pre-tokenizer chunk (`buf`: room for its mapped chars).
    pub(super) fn bpe_word(
        &self,
        word: &[u8],
        ignore_merges: bool,
        buf: &mut Vec<u8>,
        work: &mut Merge,
        out: &mut IdSink,
    ) -> Result<(), Full> {
        if word.is_empty() {
            return Ok(());
        }
        if ignore_merges {
            let table = unicode::byte_to_char_table();
            buf.clear();
            let mut utf8 = [0u8; 4];
            for &b in word {
                extend_fixed(buf, table[b as usize].encode_utf8(&mut utf8).as_bytes())?;
            }
            if let Some(id) = self.lookup(buf) {
                out.push(id);
                return Ok(());
            }
        }
        if word.len() == 1 {
            if let Some(id) = self.byte_char_token[word[0] as usize] {
                out.push(id);
            }
            return Ok(());
        }
        let n = word.len() as u32;
        let Merge { syms, heap } = work;
        syms.clear();
        for i in 0..n {
            push_fixed(
                syms,
                Sym {
                    start: i,
                    len: 1,
                    prev: if i == 0 { NONE } else { i - 1 },
                    next: if i + 1 == n { NONE } else { i + 1 },
                    id: self.byte_char_token[word[i as usize] as usize].unwrap_or(NO_ID),
                },
            )?;
        }
        heap.clear();
        let push = |heap: &mut BinaryHeap<HeapEntry>, syms: &[Sym], l: u32, r: u32| {
            if l == NONE || r == NONE {
                return Ok(());
            }
            let (a, b) = (syms[l as usize].id, syms[r as usize].id);
            if a == NO_ID || b == NO_ID {
                return Ok(());
            }
            if let Some(&(rank, _)) = self.merges.get(&(a, b)) {
                if heap.len() == heap.capacity() {
                    return Err(Full);
                }
                heap.push(std::cmp::Reverse((rank, l, r, a, b)));
            }
            Ok(())
        };
        for i in 1..n {
            push(heap, syms, i - 1, i)?;
        }
        while let Some(std::cmp::Reverse((_, l, r, a, b))) = heap.pop() {
            let (li, ri) = (l as usize, r as usize);
            if syms[li].len == 0
                || syms[ri].len == 0
                || syms[li].id != a
                || syms[ri].id != b
                || syms[li].next != r
            {
                continue;
            }
            syms[li].id = self.merges[&(a, b)].1;
            let rn = absorb_right(syms, l);
            let lp = syms[li].prev;
            push(heap, syms, lp, l)?;
            push(heap, syms, l, rn)?;
        }
        let mut i = 0;
        while i != NONE {
            let s = syms[i as usize];
            if s.id != NO_ID {
                out.push(s.id);
            }
            i = s.next;
        }
        Ok(())
    }

    /// Score-driven BPE (SentencePiece, llama2.c) over the chars of `text`. When no token holds the
    /// word separator (`▁`, or ' ' for llama2.c) after another char, no merge can cross the start
    /// of a word, so each word is merged on its own (same result, a small heap per word).
    pub(super) fn score_merge(
        &self,
        text: &[u8],
        work: &mut Merge,
        out: &mut IdSink,
    ) -> Result<(), Full> {
        let Some(sep) = self.word_sep.as_deref() else {
            return self.score_merge_span(text, work, out);
        };
        let mut start = 0;
        let mut at = 0;
        while let Some(p) = find(&text[at..], sep) {
            let pos = at + p;
            if pos > start && !text[..pos].ends_with(sep) {
                self.score_merge_span(&text[start..pos], work, out)?;
                start = pos;
            }
            at = pos + sep.len();
        }
        self.score_merge_span(&text[start..], work, out)
    }

    fn score_merge_span(
        &self,
        text: &[u8],
        work: &mut Merge,
        out: &mut IdSink,
    ) -> Result<(), Full> {
        if text.is_empty() {
            return Ok(());
        }
        let Merge { syms, heap } = work;
        syms.clear();
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
            let idx = syms.len() as u32;
            push_fixed(
                syms,
                Sym {
                    start: off as u32,
                    len: clen as u32,
                    prev: if idx == 0 { NONE } else { idx - 1 },
                    next: idx + 1,
                    id: NO_ID,
                },
            )?;
            off += clen;
        }
        let last = syms.len() - 1;
        syms[last].next = NONE;
        heap.clear();
        // Highest score first, then leftmost, then (as before) the larger right index and length.
        let push = |heap: &mut BinaryHeap<HeapEntry>, syms: &[Sym], l: u32, r: u32| {
            if l == NONE || r == NONE {
                return Ok(());
            }
            let (sl, sr) = (syms[l as usize], syms[r as usize]);
            let span = &text[sl.start as usize..(sr.start + sr.len) as usize];
            if let Some(id) = self.lookup(span) {
                if heap.len() == heap.capacity() {
                    return Err(Full);
                }
                let key = score_key(self.scores[id as usize]);
                heap.push(std::cmp::Reverse((!key, l, !r, !(span.len() as u32), 0)));
            }
            Ok(())
        };
        for i in 1..syms.len() as u32 {
            push(heap, syms, i - 1, i)?;
        }
        while let Some(std::cmp::Reverse((_, l, not_r, not_size, _))) = heap.pop() {
            let (r, size) = (!not_r, !not_size);
            let (li, ri) = (l as usize, r as usize);
            if syms[li].len == 0 || syms[ri].len == 0 || syms[li].len + syms[ri].len != size {
                continue;
            }
            let rn = absorb_right(syms, l);
            let lp = syms[li].prev;
            push(heap, syms, lp, l)?;
            push(heap, syms, l, rn)?;
        }
        let mut i = 0;
        while i != NONE {
            let s = syms[i as usize];
            let span = &text[s.start as usize..(s.start + s.len) as usize];
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
        Ok(())
    }
}

/// The buffers of one merge: symbols and pending merges.
pub(super) struct Merge<'s> {
    pub(super) syms: &'s mut Vec<Sym>,
    pub(super) heap: &'s mut BinaryHeap<HeapEntry>,
}
