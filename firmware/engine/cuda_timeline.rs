//! The decode step's timeline as the GPU runs it (`leanstream gpu-timeline`): with
//! `CudaOptions::timeline`, every kernel of the step is given a slot of a device buffer, and its
//! blocks write four %globaltimer readings there (decode.cu and attention.cuh, `trace_mark`):
//! the first block's start, the first and the last block's return from the wait for the kernel
//! before, and the last block's end. One step's slots then say where the step's time goes
//! inside the CUDA graph, which a profiler that serializes kernels (Nsight Compute) cannot.
//! A diagnostic: boot allocates the buffer and the labels only when asked, and the readings
//! cost each kernel a few atomics, so timed figures come from engines without it.

use super::{cuda, CudaEngine, EngineError};
use crate::backend::cuda::driver::{CudaResult, DeviceBuffer, Gpu};
use core::cell::RefCell;

/// What one launch of the step is, for the timeline's rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchLabel {
    /// "embed", "q/k/v", "attention", "wo", "gate/up", "down", "output".
    pub kernel: &'static str,
    /// Its layer (None: embed, output).
    pub layer: Option<usize>,
}

impl LaunchLabel {
    /// `kernel` of `layer`.
    pub const fn of(kernel: &'static str, layer: Option<usize>) -> LaunchLabel {
        LaunchLabel { kernel, layer }
    }
}

/// One launch as the GPU ran it, in ns of %globaltimer.
#[derive(Clone, Copy, Debug)]
pub struct LaunchTimes {
    pub label: LaunchLabel,
    /// The first block's start.
    pub start: u64,
    /// The first block's return from the wait for the kernel before (its inputs are ready).
    pub first_waited: u64,
    /// The last block's return from it.
    pub last_waited: u64,
    /// The last block's end.
    pub end: u64,
}

/// The slots: a device buffer of four u64 a launch, and the labels, in launch order.
pub(super) struct Timeline {
    buf: DeviceBuffer,
    /// Slots in `buf` (`max_launches`).
    slots: usize,
    labels: RefCell<Vec<LaunchLabel>>,
}

/// Launches a step can hold: embed, at most 13 a layer (three q/k/v, attention, wo, two
/// gate/up, down; q/k/v and gate/up twice with `CudaOptions::repeat_product`), the output.
fn max_launches(layers: usize) -> usize {
    2 + 13 * layers
}

impl Timeline {
    pub(super) fn boot(gpu: &Gpu, layers: usize) -> CudaResult<Timeline> {
        let n = max_launches(layers);
        Ok(Timeline {
            buf: gpu.alloc(n * 32)?,
            slots: n,
            labels: RefCell::new(Vec::with_capacity(n)),
        })
    }
}

impl CudaEngine<'_> {
    /// The start of recording a step: the labels are made again (no graph records every step).
    pub(super) fn timeline_restart(&self) {
        if let Some(t) = &self.timeline {
            t.labels.borrow_mut().clear();
        }
    }

    /// The `trace` and `trace_slot` arguments of the next launch, `label`: the buffer and a
    /// new slot, or (0, 0) without a timeline.
    pub(super) fn timeline_slot(&self, label: LaunchLabel) -> (u64, i32) {
        let Some(t) = &self.timeline else {
            return (0, 0);
        };
        let mut labels = t.labels.borrow_mut();
        // (The buffer's size, not the Vec's capacity, which may be larger.)
        assert!(
            labels.len() < t.slots,
            "more launches in a step than the timeline holds"
        );
        labels.push(label);
        (t.buf.ptr, labels.len() as i32 - 1)
    }

    /// Runs one greedy step of `token` at `pos` with the slots cleared first, and returns each
    /// launch's times and the step's greedy token; an error where boot was not asked for a
    /// timeline.
    pub fn timeline_step(
        &mut self,
        token: u32,
        pos: usize,
    ) -> Result<(Vec<LaunchTimes>, u32), EngineError> {
        let Some(t) = &self.timeline else {
            return Err(EngineError::Gpu(
                "no timeline: boot with CudaOptions::timeline".into(),
            ));
        };
        let n = t.slots;
        // Minima start at u64::MAX, maxima at 0.
        let init: Vec<u8> = (0..n)
            .flat_map(|_| [u64::MAX, u64::MAX, 0, 0])
            .flat_map(u64::to_le_bytes)
            .collect();
        self.gpu.upload(t.buf.ptr, &init).map_err(cuda)?;
        let next = self.step_greedy(token, pos).map_err(cuda)?;
        let mut raw = vec![0u8; n * 32];
        let t = self.timeline.as_ref().expect("checked above");
        self.gpu.download_async(&mut raw, t.buf.ptr).map_err(cuda)?;
        self.gpu.sync().map_err(cuda)?;
        let word = |i: usize| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap());
        let labels = t.labels.borrow();
        let times = labels
            .iter()
            .enumerate()
            .map(|(i, &label)| LaunchTimes {
                label,
                start: word(4 * i),
                first_waited: word(4 * i + 1),
                last_waited: word(4 * i + 2),
                end: word(4 * i + 3),
            })
            .collect();
        Ok((times, next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The most launches a step makes: embed, q, k, v, attention, wo, gate, up, down a layer
    /// (none stacked), q/k/v or gate/up again (a repeat), the output.
    #[test]
    fn slots_cover_the_most_launches_a_step_makes() {
        assert_eq!(max_launches(28), 1 + 28 * (3 + 1 + 1 + 2 + 1 + 3 + 2) + 1);
    }
}
