//! Calls through the trampolines into the real CUDA libraries, on the CPU: NVRTC compiles a
//! kernel (six arguments through the lazy stub), cuRAND's host generator draws normals (float
//! arguments), and the driver answers (the stub libcuda in CI: CUDA_ERROR_STUB_LIBRARY).
//!
//! Each test first opens its library through the loader, so a machine without it fails the test
//! with a message instead of the trampoline ending the test process with exit code 8.

use std::ffi::{CStr, CString, c_char, c_float, c_int, c_void};

use super::super::loader;

unsafe extern "C" {
    fn nvrtcVersion(major: *mut c_int, minor: *mut c_int) -> c_int;
    fn nvrtcCreateProgram(
        prog: *mut *mut c_void,
        src: *const c_char,
        name: *const c_char,
        num_headers: c_int,
        headers: *const *const c_char,
        include_names: *const *const c_char,
    ) -> c_int;
    fn nvrtcCompileProgram(
        prog: *mut c_void,
        num_options: c_int,
        options: *const *const c_char,
    ) -> c_int;
    fn nvrtcGetPTXSize(prog: *mut c_void, size: *mut usize) -> c_int;
    fn nvrtcGetPTX(prog: *mut c_void, ptx: *mut c_char) -> c_int;
    fn nvrtcDestroyProgram(prog: *mut *mut c_void) -> c_int;
    fn curandCreateGeneratorHost(generator: *mut *mut c_void, rng_type: c_int) -> c_int;
    fn curandSetPseudoRandomGeneratorSeed(generator: *mut c_void, seed: u64) -> c_int;
    fn curandGenerateNormal(
        generator: *mut c_void,
        out: *mut c_float,
        n: usize,
        mean: c_float,
        stddev: c_float,
    ) -> c_int;
    fn curandDestroyGenerator(generator: *mut c_void) -> c_int;
    fn cuDriverGetVersion(version: *mut c_int) -> c_int;
}

/// Opens `link_name`'s library, or fails the test saying how to make it reachable.
fn require(link_name: &str) -> &'static loader::Opened {
    let index = loader::index_of(link_name).expect("a library of the build");
    loader::open(index).unwrap_or_else(|e| {
        panic!("{e}: these tests call the real library; `source scripts/cuda-env.sh` puts it on LD_LIBRARY_PATH")
    })
}

#[test]
fn the_trampoline_is_ours_and_reaches_the_library() {
    let nvrtc = require("nvrtc");
    // SAFETY: the address of `nvrtcVersion` in libnvrtc, read as a pointer.
    let real = unsafe { nvrtc.lib.get::<*mut c_void>(b"nvrtcVersion") }.map(|s| *s).unwrap();
    assert_ne!(nvrtcVersion as *const c_void, real.cast_const(), "bound to the library directly");
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints.
    assert_eq!(unsafe { nvrtcVersion(&mut major, &mut minor) }, 0);
    assert_eq!(major, 13, "NVRTC {major}.{minor}");
}

#[test]
fn nvrtc_compiles_a_kernel_through_the_trampolines() {
    require("nvrtc");
    let src =
        CString::new("extern \"C\" __global__ void twice(float *x) { x[threadIdx.x] *= 2.0f; }")
            .unwrap();
    let name = CString::new("twice.cu").unwrap();
    let option = CString::new("--gpu-architecture=compute_90").unwrap();
    let mut prog = std::ptr::null_mut();
    // SAFETY: NVRTC's documented calls on a program this test owns; buffers sized as it says.
    let ptx = unsafe {
        let no_headers = std::ptr::null();
        assert_eq!(
            nvrtcCreateProgram(&mut prog, src.as_ptr(), name.as_ptr(), 0, no_headers, no_headers),
            0
        );
        assert_eq!(nvrtcCompileProgram(prog, 1, &option.as_ptr()), 0);
        let mut size = 0;
        assert_eq!(nvrtcGetPTXSize(prog, &mut size), 0);
        let mut ptx = vec![0u8; size];
        assert_eq!(nvrtcGetPTX(prog, ptx.as_mut_ptr().cast()), 0);
        assert_eq!(nvrtcDestroyProgram(&mut prog), 0);
        CStr::from_bytes_until_nul(&ptx).unwrap().to_string_lossy().into_owned()
    };
    assert!(ptx.contains(".entry twice"), "{ptx}");
}

#[test]
fn curand_gets_its_float_arguments() {
    require("curand");
    let mut generator = std::ptr::null_mut();
    let mut out = vec![0f32; 4096];
    // SAFETY: a host generator (no GPU) owned by this test; `out` holds n floats.
    unsafe {
        assert_eq!(curandCreateGeneratorHost(&mut generator, 100), 0); // CURAND_RNG_PSEUDO_DEFAULT
        assert_eq!(curandSetPseudoRandomGeneratorSeed(generator, 7), 0);
        assert_eq!(curandGenerateNormal(generator, out.as_mut_ptr(), out.len(), 5.0, 0.25), 0);
        assert_eq!(curandDestroyGenerator(generator), 0);
    }
    let mean = out.iter().sum::<f32>() / out.len() as f32;
    let var = out.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / out.len() as f32;
    assert!((mean - 5.0).abs() < 0.02, "mean {mean}");
    assert!((var.sqrt() - 0.25).abs() < 0.02, "stddev {}", var.sqrt());
}

#[test]
fn the_driver_answers_through_its_trampoline() {
    let driver = require("cuda");
    let mut direct = 0;
    // SAFETY: cuDriverGetVersion(int*) from the same library, called without the trampoline.
    let expected = unsafe {
        let f = driver.lib.get::<unsafe extern "C" fn(*mut c_int) -> c_int>(b"cuDriverGetVersion");
        f.unwrap()(&mut direct)
    };
    let mut version = 0;
    // SAFETY: writes one int.
    assert_eq!(unsafe { cuDriverGetVersion(&mut version) }, expected);
    assert_eq!(version, direct);
    // 0 with a driver, CUDA_ERROR_STUB_LIBRARY (34) with the stub the CI build links against.
    assert!(expected == 0 || expected == 34, "{expected}");
}

/// On a GPU machine: the probe passes, every library is found with its path, and the driver's
/// answer through the trampoline is the real one.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_probe_finds_the_driver_and_every_library() {
    let driver = super::super::probe::check(0).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("driver: {:?}, CUDA {}, {} GPU(s)", driver.path, driver.cuda, driver.devices);
    assert!(driver.cuda >= super::super::probe::MIN_CUDA);
    for lib in super::super::libraries() {
        eprintln!("{} ({}): {:?}", lib.name, lib.soname, lib.path);
        assert!(lib.error.is_none() && lib.path.is_some(), "{lib:?}");
    }
    let mut version = 0;
    // SAFETY: writes one int.
    assert_eq!(unsafe { cuDriverGetVersion(&mut version) }, 0);
    assert_eq!(super::super::probe::CudaVersion::from_driver(version), driver.cuda);
}

/// On a GPU machine: candle's quantized matmul runs nvcc-built kernels from candle-kernels
/// (`libmoe.a`) through the CUDA runtime, which `build.rs` links statically instead of
/// libcudart.so. One row takes the mat-vec kernel, sixteen the mat-mat one; both match the CPU.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_quantized_matmul_runs_on_the_static_cuda_runtime() {
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};
    let (gpu, _) = crate::gpu::open(0).unwrap_or_else(|e| panic!("{e}"));
    let cpu = Device::Cpu;
    let w = Tensor::randn(0f32, 1.0, (256, 512), &cpu).unwrap();
    for rows in [1, 16] {
        let x = Tensor::randn(0f32, 1.0, (rows, 512), &cpu).unwrap();
        let q = |w: &Tensor| QMatMul::from_qtensor(QTensor::quantize(w, GgmlDType::Q4_0).unwrap());
        let want = q(&w).unwrap().forward(&x).unwrap();
        let got = q(&w.to_device(&gpu).unwrap()).unwrap();
        let got = got.forward(&x.to_device(&gpu).unwrap()).unwrap().to_device(&cpu).unwrap();
        let err = (&got - &want).unwrap().sqr().unwrap().sum_all().unwrap().to_scalar::<f32>();
        let norm = want.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
        let rel = (err.unwrap() / norm).sqrt();
        eprintln!("{rows} row(s): relative error GPU vs CPU {rel:.2e}");
        assert!(rel < 2e-2, "{rows} row(s): {rel}");
    }
}
