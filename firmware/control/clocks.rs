//! A plan's frequency cap written to a Jetson's sysfs (paper 3.2.3: the plan may also set the
//! GPU and memory clocks). Only on a board whose config says `dvfs = true`, with its `[dvfs]`
//! files: each takes a frequency in Hz (devfreq's `max_freq`, the EMC's cap). Boot reads them
//! (the caps to go back to), a plan's cap is written only when it changes, and a plan without
//! one, a LUT removed, or the end of the process puts the boot caps back. The GPU machine's
//! and a host's clocks are never touched: their boards cannot say `dvfs`.
//!
//! After boot a write allocates nothing: the files stay open and each value is formatted on
//! the stack.

use super::plan::FreqCap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// One cap file: open for writing, and its value at boot.
struct CapFile {
    file: File,
    boot_hz: u64,
}

impl CapFile {
    fn open(path: &Path) -> io::Result<CapFile> {
        let at = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        let text = std::fs::read_to_string(path).map_err(at)?;
        let boot_hz = text.trim().parse::<u64>().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: '{}' is not a frequency in Hz",
                    path.display(),
                    text.trim()
                ),
            )
        })?;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(at)?;
        Ok(CapFile { file, boot_hz })
    }

    /// Writes `hz` as decimal at offset 0 (how sysfs takes a value), with no allocation.
    fn write(&self, hz: u64) -> io::Result<()> {
        let mut buf = [0u8; 21];
        let mut i = buf.len() - 1;
        buf[i] = b'\n';
        let mut v = hz;
        loop {
            i -= 1;
            buf[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        let n = self.file.write_at(&buf[i..], 0)?;
        if n != buf.len() - i {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "a short write"));
        }
        Ok(())
    }
}

/// The GPU's and the EMC's cap files, and the cap in force.
pub struct Clocks {
    gpu: CapFile,
    emc: CapFile,
    now: Option<FreqCap>,
    /// Writes that failed (the clocks then stay as they were; decoding goes on).
    pub errors: u64,
}

impl Clocks {
    /// Opens both files and reads their boot values. Fails (naming the file) where a file is
    /// missing, unreadable, not writable, or holds no frequency.
    pub fn open(gpu: &Path, emc: &Path) -> io::Result<Clocks> {
        Ok(Clocks {
            gpu: CapFile::open(gpu)?,
            emc: CapFile::open(emc)?,
            now: None,
            errors: 0,
        })
    }

    /// The board's files (`[dvfs]`); None where the board does not say `dvfs`.
    pub fn board() -> Option<io::Result<Clocks>> {
        crate::board::DVFS.then(|| {
            Clocks::open(
                Path::new(crate::board::DVFS_GPU_MAX_FREQ),
                Path::new(crate::board::DVFS_EMC_MAX_FREQ),
            )
        })
    }

    /// The cap in force (None: the boot caps).
    pub fn current(&self) -> Option<FreqCap> {
        self.now
    }

    /// The caps at boot, in Hz (GPU, EMC).
    pub fn boot_hz(&self) -> (u64, u64) {
        (self.gpu.boot_hz, self.emc.boot_hz)
    }

    /// Puts `cap` in force (None: the boot caps); nothing is written when it is already. A
    /// failed write is counted, and the next call tries again.
    pub fn apply(&mut self, cap: Option<FreqCap>) -> io::Result<()> {
        if cap == self.now {
            return Ok(());
        }
        let (gpu, emc) = match cap {
            Some(c) => (c.gpu_mhz as u64 * 1_000_000, c.emc_mhz as u64 * 1_000_000),
            None => self.boot_hz(),
        };
        match self.gpu.write(gpu).and_then(|_| self.emc.write(emc)) {
            Ok(()) => {
                self.now = cap;
                Ok(())
            }
            Err(e) => {
                self.errors += 1;
                // Unknown now: the next call writes again.
                self.now = Some(FreqCap {
                    gpu_mhz: u32::MAX,
                    emc_mhz: u32::MAX,
                });
                Err(e)
            }
        }
    }
}

impl Drop for Clocks {
    /// The boot caps back when the daemon stops.
    fn drop(&mut self) {
        let _ = self.apply(None);
    }
}
