//! cuBLAS, loaded at run time (cudarc's `cublas` bindings with dynamic loading: building needs
//! no CUDA, and a machine without the library keeps the project's own PTX products). One call:
//! `gemm_f16`, the batched prefill's product of f16 weights and f16 inputs into f32 sums on
//! tensor cores. Its workspace is a device buffer the caller carves at boot, so a product
//! allocates nothing.
//!
//! The library is looked up under cudarc's names (`libcublas.so`, `libcublas.so.12`, ...): a
//! JetPack's CUDA 12 has them; a CUDA 13 install needs `libcublas.so.13` linked as one of them
//! on `LD_LIBRARY_PATH` (scripts/hil-run.sh does so on the H200 machine).

use super::driver::{CudaError, CudaResult, Gpu};
use cudarc::cublas::sys::{self, cublasStatus_t};
use cudarc::driver::sys::CUdeviceptr;
use std::ffi::c_void;

fn check(call: &'static str, r: cublasStatus_t) -> CudaResult<()> {
    if r == cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CudaError {
            call,
            code: format!("{r:?}"),
        })
    }
}

/// Workspace bytes cuBLAS is given (NVIDIA's advice: 32 MiB on Hopper, 4 MiB before it).
pub fn workspace_bytes(cc: (i32, i32)) -> usize {
    if cc.0 >= 9 {
        32 << 20
    } else {
        4 << 20
    }
}

/// A cuBLAS handle bound to the GPU's stream and a workspace the caller owns.
pub struct Blas {
    handle: sys::cublasHandle_t,
}

// SAFETY: the handle is used by one thread at a time (the engine's), with the GPU's context
// current (`Gpu::bind`); cuBLAS allows a handle to move between threads.
unsafe impl Send for Blas {}

impl Blas {
    /// Whether the library can be loaded here.
    pub fn present() -> bool {
        // SAFETY: only tries to open the library by its candidate names.
        unsafe { sys::is_culib_present() }
    }

    /// A handle on `gpu`'s stream using `workspace` (`bytes` long, alive as long as the
    /// handle). Call only where `present()`: the bindings panic on a missing library.
    pub fn open(gpu: &Gpu, workspace: CUdeviceptr, bytes: usize) -> CudaResult<Blas> {
        let mut handle = std::ptr::null_mut();
        // SAFETY: out-pointer valid; the stream and the workspace outlive the handle (the
        // engine drops its Blas before its buffers and its Gpu).
        unsafe {
            check("cublasCreate", sys::cublasCreate_v2(&mut handle))?;
            let blas = Blas { handle };
            check(
                "cublasSetStream",
                sys::cublasSetStream_v2(handle, gpu.stream as sys::cudaStream_t),
            )?;
            check(
                "cublasSetWorkspace",
                sys::cublasSetWorkspace_v2(handle, workspace as *mut c_void, bytes),
            )?;
            Ok(blas)
        }
    }

    /// `y[t][r] = beta y[t][r] + W[r] . x[t]` for r < rows, t < n: W rows x cols f16 (rows
    /// `cols` apart), x n x cols f16 (rows `ldx` apart), y f32 (rows `ldy` apart). cuBLAS is
    /// column-major: this is C (rows x n) = W^T' (W as cols x rows) times x (cols x n).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_f16(
        &self,
        rows: usize,
        n: usize,
        cols: usize,
        w: CUdeviceptr,
        x: CUdeviceptr,
        ldx: usize,
        y: CUdeviceptr,
        ldy: usize,
        beta: f32,
    ) -> CudaResult<()> {
        let alpha = 1.0f32;
        // SAFETY: the pointers are device buffers of the sizes stated above (callers carve
        // them at boot); alpha and beta are host floats read during the call.
        unsafe {
            check(
                "cublasGemmEx",
                sys::cublasGemmEx(
                    self.handle,
                    sys::cublasOperation_t::CUBLAS_OP_T,
                    sys::cublasOperation_t::CUBLAS_OP_N,
                    rows as i32,
                    n as i32,
                    cols as i32,
                    &alpha as *const f32 as *const c_void,
                    w as *const c_void,
                    sys::cudaDataType::CUDA_R_16F,
                    cols as i32,
                    x as *const c_void,
                    sys::cudaDataType::CUDA_R_16F,
                    ldx as i32,
                    &beta as *const f32 as *const c_void,
                    y as *mut c_void,
                    sys::cudaDataType::CUDA_R_32F,
                    ldy as i32,
                    sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                ),
            )
        }
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle was created in `open` and is destroyed once.
        unsafe {
            sys::cublasDestroy_v2(self.handle);
        }
    }
}
