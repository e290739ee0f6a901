//! A bounds-checked little-endian cursor over the file's bytes: every read says what it reads,
//! so that a short file is reported as what is missing where.

use super::FormatError;

pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(super) fn take(
        &mut self,
        n: usize,
        what: &dyn Fn() -> String,
    ) -> Result<&'a [u8], FormatError> {
        if n > self.remaining() {
            return Err(FormatError::Truncated {
                offset: self.pos,
                what: what(),
                need: n,
                have: self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub(super) fn array<const N: usize>(
        &mut self,
        what: &dyn Fn() -> String,
    ) -> Result<[u8; N], FormatError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(super) fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(super) fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A u64 length or count, bounded so that `count * min_each` bytes still remain.
    pub(super) fn count(
        &mut self,
        min_each: usize,
        what: &dyn Fn() -> String,
    ) -> Result<usize, FormatError> {
        let at = self.pos;
        let n = self.u64(what)?;
        let max = (self.remaining() / min_each.max(1)) as u64;
        if n > max {
            return Err(FormatError::Invalid {
                offset: at,
                msg: format!(
                    "{} is {n}, but only {} bytes remain (at most {max} fit)",
                    what(),
                    self.remaining()
                ),
            });
        }
        Ok(n as usize)
    }

    pub(super) fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, FormatError> {
        let at = self.pos;
        let len = self.count(1, &|| format!("length of {}", what()))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| FormatError::Invalid {
            offset: at,
            msg: format!("{} is not valid UTF-8 ({e})", what()),
        })
    }
}
