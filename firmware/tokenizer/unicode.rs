//! Unicode helpers for the pre-tokenizers: the categories `\p{L}` and `\p{N}`, White_Space, and the
//! GPT-2 byte <-> unicode map of byte-level BPE vocabularies.

use super::unicode_tables::{LETTER_RANGES, NUMBER_RANGES};

fn in_ranges(ranges: &[(u32, u32)], c: char) -> bool {
    let cp = c as u32;
    ranges
        .binary_search_by(|&(lo, hi)| {
            if hi < cp {
                std::cmp::Ordering::Less
            } else if lo > cp {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// `\p{L}`: general category Lu, Ll, Lt, Lm or Lo.
pub(crate) fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    in_ranges(&LETTER_RANGES, c)
}

/// `\p{N}`: general category Nd, Nl or No.
pub(crate) fn is_number(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    in_ranges(&NUMBER_RANGES, c)
}

/// `\s`: the Unicode White_Space property (the set llama.cpp uses).
pub(crate) fn is_whitespace(c: char) -> bool {
    c.is_whitespace()
}

/// GPT-2's byte -> char map: printable Latin-1 bytes map to themselves, the other 68 bytes to
/// U+0100.. in order.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let keep =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let cp = if keep {
            b
        } else {
            n += 1;
            255 + n
        };
        table[b as usize] = char::from_u32(cp).expect("valid code point");
    }
    table
}

/// The inverse of [`byte_to_char_table`]: `None` for chars outside the map.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    match cp {
        0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => Some(cp as u8),
        0x100..=0x143 => {
            // The n-th byte not kept, in increasing order.
            let n = cp - 0x100;
            let mut seen = 0;
            for b in 0..256u32 {
                let keep = (0x21..=0x7E).contains(&b)
                    || (0xA1..=0xAC).contains(&b)
                    || (0xAE..=0xFF).contains(&b);
                if !keep {
                    if seen == n {
                        return Some(b as u8);
                    }
                    seen += 1;
                }
            }
            None
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_round_trips() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        for (b, &c) in t.iter().enumerate() {
            assert_eq!(char_to_byte(c), Some(b as u8));
        }
    }

    #[test]
    fn categories() {
        assert!(is_letter('é') && is_letter('я') && is_letter('我'));
        assert!(!is_letter('\u{17b6}')); // Khmer vowel sign: a mark, not a letter
        assert!(is_number('3') && is_number('½') && !is_number('a'));
        assert!(is_whitespace('\u{3000}') && !is_whitespace('\u{200d}'));
    }
}
