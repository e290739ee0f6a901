//! Decoding: the bytes of each token, and of a sequence of ids as text.

use super::{Algo, Tokenizer};

impl Tokenizer {
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

    /// The bytes token `id` adds to a text when it follows token `prev`:
    /// [`token_bytes`](Self::token_bytes), less the leading space of a SentencePiece or llama2.c piece right
    /// after BOS (the space the encoder prepends), as llama2.c's run.c and llama.cpp drop it.
    pub fn piece_after(&self, prev: u32, id: u32) -> &[u8] {
        let piece = self.token_bytes(id);
        match piece {
            [b' ', rest @ ..] if self.strips_prefix_space() && Some(prev) == self.bos => rest,
            _ => piece,
        }
    }

    /// Whether the encoder prepends a space that decoding drops at the start of a text.
    fn strips_prefix_space(&self) -> bool {
        match self.algo {
            Algo::Spm => self.add_space_prefix,
            Algo::Llama2c => true,
            Algo::Bpe { .. } => false,
        }
    }

    /// Decodes `ids` to text (invalid UTF-8 replaced by U+FFFD). For SentencePiece and llama2.c
    /// vocabularies the one space the encoder prepends is stripped from the first text token when it
    /// is at the start or right after a leading BOS.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        let strip = self.strips_prefix_space();
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
}
