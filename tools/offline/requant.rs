//! `leanstream requant`: a GGUF requantized offline into the GGML types of a precision, so that
//! boot imports every matrix as it is. At `w8a8` every matrix becomes `Q8_0`; at `w4a8` the
//! attention matrices and the FFN's gate and up become `Q4_0` and the rest `Q8_0` (the same
//! targets as [`leanstream::quant::target`]); at `f16` every matrix becomes `F16`. The values are exactly those
//! boot's own requantization gives ([`leanstream::quant::convert`]): a requantized file booted at its precision
//! decodes bit for bit as the original booted at that precision. The int4 packing is not in the
//! file: GGUF's `Q4_0` block is the exchange format, and boot lays its nibbles out in the chosen
//! `--packing` (values kept). The output is a plain GGUF, so llama.cpp runs it too.
//!
//! The flash image of DESIGN.md section 5 (`leanstream flash`: the FFN stored as neuron bundles
//! for streaming) is the SSD-streaming work's; this is its dense, requantized part.

use leanstream::model::ggml::{dequantize_row, GgmlType};
use leanstream::model::gguf::{build, Gguf, Value};
use leanstream::model::TensorRef;
use leanstream::quant::{convert_to_ggml, target, Conversion, Precision, Role, Target};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

/// GGUF's `general.file_type` for a file that is mostly `ty` (llama.cpp's `LLAMA_FTYPE_*`).
fn file_type(precision: Precision) -> u32 {
    match precision {
        Precision::F16 => 1,
        Precision::W4a8 => 2,
        _ => 7,
    }
}

/// One line of the report: matrices of one source type that went to one GGML type.
#[derive(Clone, Debug, PartialEq)]
pub struct FlashLine {
    pub from: GgmlType,
    pub to: GgmlType,
    pub how: Conversion,
    pub matrices: usize,
    pub bytes: usize,
}

/// What `requant` wrote.
#[derive(Clone, Debug, Default)]
pub struct FlashReport {
    pub lines: Vec<FlashLine>,
    /// Vectors and matrices whose rows are not whole groups of 32, copied as they are.
    pub kept_tensors: usize,
    pub bytes_in: usize,
    pub bytes_out: usize,
    /// Relative RMS error over every requantized matrix: sqrt(sum (w' - w)^2 / sum w^2).
    pub rel_rms: f64,
    /// The requantized matrix with the largest relative RMS error, and that error.
    pub worst: Option<(String, f64)>,
}

impl fmt::Display for FlashReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: usize| b as f64 / 1048576.0;
        for l in &self.lines {
            let how = match l.how {
                Conversion::AsIs => "copied as they are",
                Conversion::Requantized if l.to == GgmlType::F16 => "converted",
                Conversion::Requantized => "requantized (round to nearest, group 32)",
            };
            writeln!(
                f,
                "  {} {} -> {} {how}, {:.1} MiB",
                l.matrices,
                l.from.name(),
                l.to.name(),
                mib(l.bytes)
            )?;
        }
        writeln!(
            f,
            "  {} vectors and odd-width tensors copied as they are",
            self.kept_tensors
        )?;
        if let Some((name, e)) = &self.worst {
            writeln!(
                f,
                "  requantization error (relative RMS): {:.3e} over all, worst {name} {e:.3e}",
                self.rel_rms
            )?;
        }
        write!(
            f,
            "  {:.1} MiB -> {:.1} MiB",
            mib(self.bytes_in),
            mib(self.bytes_out)
        )
    }
}

/// Sum of squared differences between two tensors' values, and the sum of squares of `a`'s.
fn squared_error(a: &TensorRef, b_ty: GgmlType, b: &[u8], scratch: &mut Vec<f32>) -> (f64, f64) {
    let mut other = vec![0f32; a.cols];
    scratch.resize(a.cols, 0.0);
    let (arb, brb) = (a.data.len() / a.rows.max(1), b.len() / a.rows.max(1));
    let (mut err, mut norm) = (0f64, 0f64);
    for r in 0..a.rows {
        dequantize_row(a.ty, &a.data[r * arb..][..arb], scratch);
        dequantize_row(b_ty, &b[r * brb..][..brb], &mut other);
        for (&x, &y) in scratch.iter().zip(&other) {
            err += ((y - x) as f64).powi(2);
            norm += (x as f64).powi(2);
        }
    }
    (err, norm)
}

/// Where the output is written before it is renamed into place.
fn partial_path(out: &Path) -> PathBuf {
    let mut p = out.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
}

/// Requantizes the GGUF at `input` into `precision`'s GGML types and writes it to `out`
/// (through `out.partial`, renamed into place once whole, so a failed run leaves no torn file).
pub fn requant(input: &Path, precision: Precision, out: &Path) -> Result<FlashReport, String> {
    if precision == Precision::Native {
        return Err(
            "requant needs a precision to requantize to: --precision f16, w8a8 or w4a8".into(),
        );
    }
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same(input, out) {
        return Err(format!(
            "{}: the output would overwrite the input; give another --out",
            out.display()
        ));
    }
    let g = Gguf::open(input).map_err(|e| {
        format!(
            "{}: {e} (requant reads GGUF files; llama.cpp's convert script makes one from a checkpoint)",
            input.display()
        )
    })?;

    // Metadata: every key as it is, but the file type, plus a note of what requant did.
    let mut kv: Vec<(String, u32, Vec<u8>)> = g
        .metadata()
        .iter()
        .filter(|(k, _)| {
            // Earlier versions of this tool wrote its note as `leanstream.flash.*`.
            k != "general.file_type"
                && !k.starts_with("leanstream.requant.")
                && !k.starts_with("leanstream.flash.")
        })
        .map(|(k, v)| {
            let (ty, b) = v.encode();
            (k.clone(), ty, b)
        })
        .collect();
    for (k, v) in [
        ("general.file_type", Value::U32(file_type(precision))),
        (
            "leanstream.requant.precision",
            Value::Str(precision.name().into()),
        ),
    ] {
        let (ty, b) = v.encode();
        kv.push((k.into(), ty, b));
    }

    // Convert every tensor first (the models this runs on fit in memory many times over), so
    // the header can give each its offset.
    let mut report = FlashReport {
        bytes_in: g.bytes().len(),
        ..Default::default()
    };
    let mut scratch = Vec::new();
    let mut tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)> = Vec::new();
    let (mut err, mut norm) = (0f64, 0f64);
    // The first and last layer keep more bits at w4a8 (`Role::of`).
    let n_layers = g
        .tensors
        .iter()
        .filter_map(|t| leanstream::quant::layer_of(&t.name))
        .max()
        .map_or(0, |i| i + 1);
    for info in &g.tensors {
        let data = g.tensor_data(info);
        let cols = info.dims.first().copied().unwrap_or(1);
        let rows = info.dims.iter().skip(1).product::<usize>();
        let t = TensorRef {
            ty: info.ty,
            cols,
            rows,
            data,
        };
        let dims = info.dims.iter().map(|&d| d as u64).collect();
        let matrix = info.dims.len() >= 2 && info.ty.row_bytes(cols).is_some();
        let tg = if matrix {
            target(
                precision,
                leanstream::quant::Packing::default(),
                Role::of(&info.name, n_layers),
                info.ty,
                cols,
            )
        } else {
            Target::Keep
        };
        if tg == Target::Keep {
            report.kept_tensors += 1;
            tensors.push((info.name.clone(), dims, info.ty, data.to_vec()));
            continue;
        }
        let (ty, bytes, how) = convert_to_ggml(tg, &t, &mut scratch);
        if how == Conversion::Requantized {
            let (e, n) = squared_error(&t, ty, &bytes, &mut scratch);
            err += e;
            norm += n;
            let rel = (e / n.max(f64::MIN_POSITIVE)).sqrt();
            if report.worst.as_ref().is_none_or(|w| rel > w.1) {
                report.worst = Some((info.name.clone(), rel));
            }
        }
        match report
            .lines
            .iter_mut()
            .find(|l| l.from == info.ty && l.to == ty && l.how == how)
        {
            Some(l) => {
                l.matrices += 1;
                l.bytes += bytes.len();
            }
            None => report.lines.push(FlashLine {
                from: info.ty,
                to: ty,
                how,
                matrices: 1,
                bytes: bytes.len(),
            }),
        }
        tensors.push((info.name.clone(), dims, ty, bytes));
    }
    report.rel_rms = (err / norm.max(f64::MIN_POSITIVE)).sqrt();

    let builder = build::Builder {
        kv,
        tensors: tensors
            .into_iter()
            .map(|(n, d, ty, b)| (n, d, ty as u32, b))
            .collect(),
        alignment: g.alignment,
        version: 3,
    };
    let image = builder.build();
    report.bytes_out = image.len();
    drop(builder);
    let partial = partial_path(out);
    let written = std::fs::File::create(&partial)
        .and_then(|mut f| {
            f.write_all(&image)?;
            f.sync_all()
        })
        .map_err(|e| format!("{}: {e}", partial.display()))
        // The image must read back as a model before it replaces anything.
        .and_then(|_| {
            leanstream::model::ModelFile::open(&partial)
                .and_then(|m| m.hyper().map(|_| ()))
                .map_err(|e| {
                    format!(
                        "requant wrote a file that does not read back: {}: {e}",
                        partial.display()
                    )
                })
        })
        .and_then(|_| {
            std::fs::rename(&partial, out).map_err(|e| format!("{}: {e}", out.display()))
        });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    Ok(report)
}
