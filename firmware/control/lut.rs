//! `LUT[layer][state] -> plan` (paper eq. 8), with the state quantizer that makes a layer's
//! remaining load volume a state, stored as a table file (`tables::encode`: magic, kind
//! `ctl-lut`, format version, model identity, FNV-1a checksum, postcard payload).
//!
//! The state: R_n, the bytes of layer n's wanted blocks not in the cache when the layer starts
//! (in flight counts as not yet read), quantized by per-layer edges in bytes: state s holds
//! `edges[s - 1] <= R < edges[s]`. The profiler sets the edges at quantiles of the R it saw at
//! that layer (so each state is about equally likely); the edges are in the file, so online the
//! quantizer and the table agree by construction.

use super::plan::{PlanCaps, PlanError, StreamPlan};
use crate::tables::{self, TableError};
use std::fmt;
use std::path::Path;

pub const LUT_KIND: &str = "ctl-lut";
pub const LUT_VERSION: u32 = 1;
/// States a layer may have at most (the quantizer's bins).
pub const MAX_STATES: usize = 16;

/// The file's payload.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct LutFile {
    pub(super) board: String,
    pub(super) layers: u32,
    pub(super) states: u32,
    /// Layers ahead the recursion looked (eq. 7's H), and the energy weight of its cost.
    pub(super) horizon: u32,
    pub(super) energy_weight: f32,
    pub(super) plans: Vec<StreamPlan>,
    /// `layers * (states - 1)` ascending byte edges.
    pub(super) edges: Vec<u64>,
    /// `layers * states` plan indices.
    pub(super) entries: Vec<u16>,
}

/// The controller's table, checked: every entry names a plan, every plan fits the board.
#[derive(Clone, Debug, PartialEq)]
pub struct Lut {
    file: LutFile,
}

/// Why a LUT file was refused.
#[derive(Debug)]
pub enum LutError {
    /// Unreadable, not a table, another kind, version or model, truncated or damaged.
    Table(TableError),
    /// Made for another board (its plans' caps are that board's).
    Board { expected: String, found: String },
    /// Made for a model with another number of layers.
    Layers { expected: usize, found: usize },
    /// A plan does not fit this board.
    Plan { index: usize, error: PlanError },
    /// Decoded, but inconsistent (a bad entry, edges out of order, sizes that disagree).
    Invalid(String),
    /// Its plans cap clocks, and the board's cap files could not be opened.
    Clocks(std::io::Error),
}

impl fmt::Display for LutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LutError::Table(e) => write!(f, "controller LUT: {e}"),
            LutError::Board { expected, found } => write!(
                f,
                "controller LUT was made for board '{found}', this is '{expected}': profile and solve on this board"
            ),
            LutError::Layers { expected, found } => write!(
                f,
                "controller LUT has {found} layers, the model has {expected}"
            ),
            LutError::Plan { index, error } => {
                write!(f, "controller LUT: plan {index}: {error}")
            }
            LutError::Invalid(m) => write!(f, "controller LUT is invalid: {m}"),
            LutError::Clocks(e) => write!(
                f,
                "controller LUT caps clocks, but the board's [dvfs] files cannot be used: {e}"
            ),
        }
    }
}

impl std::error::Error for LutError {}

impl From<TableError> for LutError {
    fn from(e: TableError) -> LutError {
        LutError::Table(e)
    }
}

impl Lut {
    /// A table over `plans`: `edges[l]` the layer's `states - 1` ascending byte edges,
    /// `entries[l][s]` its plan per state.
    pub fn new(
        board: &str,
        plans: Vec<StreamPlan>,
        edges: &[Vec<u64>],
        entries: &[Vec<u16>],
        horizon: usize,
        energy_weight: f32,
    ) -> Result<Lut, LutError> {
        let states = entries.first().map_or(0, Vec::len);
        let file = LutFile {
            board: board.into(),
            layers: entries.len() as u32,
            states: states as u32,
            horizon: horizon as u32,
            energy_weight,
            plans,
            edges: edges.concat(),
            entries: entries.concat(),
        };
        if entries.iter().any(|e| e.len() != states) || edges.iter().any(|e| e.len() + 1 != states)
        {
            return Err(LutError::Invalid(
                "every layer needs the same number of states and states - 1 edges".into(),
            ));
        }
        Lut::checked(file)
    }

    /// One plan for every layer and state (a static plan).
    pub fn single(board: &str, plan: StreamPlan, layers: usize) -> Result<Lut, LutError> {
        Lut::new(
            board,
            vec![plan],
            &vec![Vec::new(); layers],
            &vec![vec![0]; layers],
            0,
            0.0,
        )
    }

    fn checked(file: LutFile) -> Result<Lut, LutError> {
        let (layers, states) = (file.layers as usize, file.states as usize);
        if layers == 0 || states == 0 || states > MAX_STATES {
            return Err(LutError::Invalid(format!(
                "{layers} layers of {states} states (1 to {MAX_STATES} states, at least one layer)"
            )));
        }
        if file.plans.is_empty() || file.plans.len() > u16::MAX as usize {
            return Err(LutError::Invalid(format!("{} plans", file.plans.len())));
        }
        if file.entries.len() != layers * states || file.edges.len() != layers * (states - 1) {
            return Err(LutError::Invalid(format!(
                "{} entries and {} edges for {layers} layers of {states} states",
                file.entries.len(),
                file.edges.len()
            )));
        }
        if let Some(i) = file
            .entries
            .iter()
            .position(|&p| p as usize >= file.plans.len())
        {
            return Err(LutError::Invalid(format!(
                "layer {} state {} names plan {} of {}",
                i / states,
                i % states,
                file.entries[i],
                file.plans.len()
            )));
        }
        for (l, e) in file
            .edges
            .chunks(states.max(2) - 1)
            .enumerate()
            .take(layers)
        {
            if states > 1 && e.windows(2).any(|w| w[0] > w[1]) {
                return Err(LutError::Invalid(format!(
                    "layer {l}'s edges are not ascending"
                )));
            }
        }
        if !file.energy_weight.is_finite() || file.energy_weight < 0.0 {
            return Err(LutError::Invalid(format!(
                "energy weight {}",
                file.energy_weight
            )));
        }
        Ok(Lut { file })
    }

    /// Checks the plans against `caps`, and the table against the board and the model's layers.
    pub fn check_for(&self, board: &str, layers: usize, caps: PlanCaps) -> Result<(), LutError> {
        if self.file.board != board {
            return Err(LutError::Board {
                expected: board.into(),
                found: self.file.board.clone(),
            });
        }
        if self.layers() != layers {
            return Err(LutError::Layers {
                expected: layers,
                found: self.layers(),
            });
        }
        for (index, p) in self.file.plans.iter().enumerate() {
            p.check(caps)
                .map_err(|error| LutError::Plan { index, error })?;
        }
        Ok(())
    }

    pub fn encode(&self, model_id: u64) -> Vec<u8> {
        tables::encode(LUT_KIND, LUT_VERSION, model_id, &self.file)
    }

    pub fn decode(bytes: &[u8], model_id: u64) -> Result<Lut, LutError> {
        Lut::checked(tables::decode(bytes, LUT_KIND, LUT_VERSION, model_id)?)
    }

    pub fn write(&self, path: &Path, model_id: u64) -> Result<(), LutError> {
        std::fs::write(path, self.encode(model_id)).map_err(|source| {
            LutError::Table(TableError::Io {
                path: path.to_path_buf(),
                source,
            })
        })
    }

    /// Reads a LUT made for `model_id` (the image's tables identity).
    pub fn read(path: &Path, model_id: u64) -> Result<Lut, LutError> {
        Lut::decode(&tables::read_bytes(path)?, model_id)
    }

    pub fn layers(&self) -> usize {
        self.file.layers as usize
    }

    pub fn states(&self) -> usize {
        self.file.states as usize
    }

    pub fn plans(&self) -> &[StreamPlan] {
        &self.file.plans
    }

    pub fn horizon(&self) -> usize {
        self.file.horizon as usize
    }

    pub fn energy_weight(&self) -> f32 {
        self.file.energy_weight
    }

    pub fn board(&self) -> &str {
        &self.file.board
    }

    /// Layer `l`'s byte edges.
    pub fn edges(&self, l: usize) -> &[u64] {
        let k = self.states() - 1;
        &self.file.edges[l * k..(l + 1) * k]
    }

    /// The state of layer `l` with `remaining` bytes to read (Q(R_n)): edges passed.
    pub fn state(&self, l: usize, remaining: u64) -> usize {
        self.edges(l)
            .iter()
            .take_while(|&&e| e <= remaining)
            .count()
    }

    /// `LUT[l][s]`: the plan index.
    pub fn entry(&self, l: usize, s: usize) -> usize {
        self.file.entries[l * self.states() + s] as usize
    }

    /// Eq. 9: the plan for layer `l` with `remaining` bytes to read, and its index.
    pub fn plan(&self, l: usize, remaining: u64) -> (usize, &StreamPlan) {
        let p = self.entry(l, self.state(l, remaining));
        (p, &self.file.plans[p])
    }
}
