//! Launches this crate's kernels on the current GPU and checks each result
//! against a CPU reference. Run by fraglink's `tests/downstream.rs` (an
//! ignored test that needs a GPU) from the binary the GPU archive carries.

use fraglink::fragment::{FragmentInfo, StaticFragment};
use fraglink::gpu::{
    GpuBuffer, GpuContext, KernelArgs, KernelResources, LaunchConfig, Launcher, MemoryPool,
    PoolConfig, Transfer,
};
use fraglink::link::Planner;

use crate::registry::{ElementwiseFragment, Float, QuantizeFragment, WmmaFragment};

type Result<T> = std::result::Result<T, String>;

struct Gpu {
    ctx: GpuContext,
    pool: MemoryPool,
    t: Transfer,
}

impl Gpu {
    /// Links `entry` (or the lowered name of a name expression) from `info`
    /// for this GPU and loads it.
    fn load(&self, plan: Planner, entry: &str) -> Result<Launcher> {
        let linked = plan.link_for(self.ctx.arch()).map_err(|e| e.to_string())?;
        let m = linked
            .kernel
            .kernel(entry)
            .ok_or_else(|| format!("no metadata for {entry}"))?;
        let res = KernelResources {
            registers: m.registers,
            static_shared_bytes: m.shared_bytes.unwrap_or(0),
            max_threads_per_block: None,
        };
        Launcher::load(&self.ctx, &linked.kernel.cubin, entry, res).map_err(|e| e.to_string())
    }
    fn up<T: cudarc::driver::DeviceRepr>(&self, v: &[T]) -> Result<GpuBuffer<T>> {
        self.t.upload_new(&self.pool, v).map_err(|e| e.to_string())
    }
    fn down<T: cudarc::driver::DeviceRepr + Default + Clone>(
        &self,
        b: &GpuBuffer<T>,
    ) -> Result<Vec<T>> {
        self.t.download_vec(b).map_err(|e| e.to_string())
    }
}

fn elementwise() -> &'static FragmentInfo {
    <ElementwiseFragment<256>>::info()
}

fn affine_f32(g: &Gpu) -> Result<()> {
    let n = 1000usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 100.0).collect();
    let l = g.load(
        Planner::new("affine_f32").add_fragment(elementwise()),
        "affine_f32",
    )?;
    let xb = g.up(&x)?;
    let mut yb = g.up(&vec![0.0f32; n])?;
    let mut a = KernelArgs::new();
    a.input(&xb).map_err(|e| e.to_string())?;
    a.output(&mut yb).map_err(|e| e.to_string())?;
    a.value(2.0f32).value(1.0f32).value(n as u32);
    let cfg = LaunchConfig::linear(n as u64, 256).map_err(|e| e.to_string())?;
    // SAFETY: (const float*, float*, float, float, uint32_t) over n elements.
    unsafe { l.launch(&cfg, &mut a) }.map_err(|e| e.to_string())?;
    drop(a);
    let y = g.down(&yb)?;
    check(
        "affine_f32",
        x.iter().zip(&y).all(|(x, y)| *y == 2.0 * x + 1.0),
    )
}

fn saturate_abs(g: &Gpu) -> Result<()> {
    let x = vec![i32::MIN, -5, 0, 7, i32::MAX];
    let l = g.load(
        Planner::new("saturate_abs_i32").add_fragment(elementwise()),
        "saturate_abs_i32",
    )?;
    let xb = g.up(&x)?;
    let mut yb = g.up(&vec![0i32; x.len()])?;
    let mut a = KernelArgs::new();
    a.input(&xb).map_err(|e| e.to_string())?;
    a.output(&mut yb).map_err(|e| e.to_string())?;
    a.value(x.len() as u32);
    let cfg = LaunchConfig::linear(x.len() as u64, 256).map_err(|e| e.to_string())?;
    // SAFETY: (const int32_t*, int32_t*, uint32_t) over x.len() elements.
    unsafe { l.launch(&cfg, &mut a) }.map_err(|e| e.to_string())?;
    drop(a);
    check(
        "saturate_abs_i32",
        g.down(&yb)? == [i32::MAX, 5, 0, 7, i32::MAX],
    )
}

fn fill_zero(g: &Gpu) -> Result<()> {
    let n = 300usize;
    let l = g.load(
        Planner::new("fill_zero_f32").add_fragment(elementwise()),
        "fill_zero_f32",
    )?;
    let mut yb = g.up(&vec![7.0f32; n])?;
    let mut a = KernelArgs::new();
    a.output(&mut yb).map_err(|e| e.to_string())?;
    a.value(n as u32);
    let cfg = LaunchConfig::linear(n as u64, 256).map_err(|e| e.to_string())?;
    // SAFETY: (float*, uint32_t) over n elements.
    unsafe { l.launch(&cfg, &mut a) }.map_err(|e| e.to_string())?;
    drop(a);
    check("fill_zero_f32", g.down(&yb)?.iter().all(|v| *v == 0.0))
}

fn affine_bf16(g: &Gpu) -> Result<()> {
    if g.ctx.arch().number < 80 {
        println!(
            "gpu skip affine_bf16 (needs sm_80, this GPU is {})",
            g.ctx.arch()
        );
        return Ok(());
    }
    let x: Vec<u16> = [1.0f32, -2.0, 0.5, 3.0]
        .iter()
        .map(|v| (v.to_bits() >> 16) as u16)
        .collect();
    let l = g.load(
        Planner::new("affine_bf16").add_fragment(elementwise()),
        "affine_bf16",
    )?;
    let xb = g.up(&x)?;
    let mut yb = g.up(&vec![0u16; x.len()])?;
    let mut a = KernelArgs::new();
    a.input(&xb).map_err(|e| e.to_string())?;
    a.output(&mut yb).map_err(|e| e.to_string())?;
    a.value(2.0f32).value(1.0f32).value(x.len() as u32);
    let cfg = LaunchConfig::linear(x.len() as u64, 256).map_err(|e| e.to_string())?;
    // SAFETY: (const bf16*, bf16*, float, float, uint32_t) over 4 elements.
    unsafe { l.launch(&cfg, &mut a) }.map_err(|e| e.to_string())?;
    drop(a);
    let y: Vec<f32> = g
        .down(&yb)?
        .iter()
        .map(|b| f32::from_bits(u32::from(*b) << 16))
        .collect();
    check("affine_bf16", y == [3.0, -3.0, 2.0, 7.0])
}

fn quantize(g: &Gpu) -> Result<()> {
    let x = vec![0.0f32, 0.26, -0.5, 10.0, -10.0];
    let info = <QuantizeFragment<Float>>::info();
    let entry = info
        .lowered_name("quantize<float>")
        .ok_or("no lowered name for quantize<float>")?;
    let plan = Planner::empty()
        .kernel::<QuantizeFragment<Float>>("quantize<float>")
        .map_err(|e| e.to_string())?;
    let l = g.load(plan, entry)?;
    let xb = g.up(&x)?;
    let mut qb = g.up(&vec![0i8; x.len()])?;
    let mut a = KernelArgs::new();
    a.input(&xb).map_err(|e| e.to_string())?;
    a.output(&mut qb).map_err(|e| e.to_string())?;
    a.value(100.0f32).value(x.len() as u32);
    let cfg = LaunchConfig::linear(x.len() as u64, 256).map_err(|e| e.to_string())?;
    // SAFETY: (const float*, int8_t*, float, uint32_t) over 5 elements.
    unsafe { l.launch(&cfg, &mut a) }.map_err(|e| e.to_string())?;
    drop(a);
    check("quantize<float>", g.down(&qb)? == [0, 26, -50, 127, -127])
}

fn wmma(g: &Gpu) -> Result<()> {
    // A = identity (row-major), B = k + 16*n in column-major: C = B as row-major.
    let one = 0x3c00u16; // 1.0 in binary16
    let a: Vec<u16> = (0..256)
        .map(|i| if i / 16 == i % 16 { one } else { 0 })
        .collect();
    let b_vals: Vec<f32> = (0..256).map(|i| (i % 7) as f32).collect();
    let to_half = |v: f32| -> u16 {
        // Small integers are exact in binary16: sign 0, exponent and mantissa.
        if v == 0.0 {
            0
        } else {
            let e = v.log2().floor() as i32;
            let m = ((v / 2f32.powi(e) - 1.0) * 1024.0).round() as u16;
            (((e + 15) as u16) << 10) | m
        }
    };
    let b: Vec<u16> = b_vals.iter().map(|v| to_half(*v)).collect();
    let info = <WmmaFragment<16>>::info();
    let l = g.load(
        Planner::new("wmma_16x16x16_f16").add_fragment(info),
        "wmma_16x16x16_f16",
    )?;
    let ab = g.up(&a)?;
    let bb = g.up(&b)?;
    let mut cb = g.up(&vec![0.0f32; 256])?;
    let mut args = KernelArgs::new();
    args.input(&ab).map_err(|e| e.to_string())?;
    args.input(&bb).map_err(|e| e.to_string())?;
    args.output(&mut cb).map_err(|e| e.to_string())?;
    let cfg = LaunchConfig::new((1, 1, 1), (32, 1, 1));
    // SAFETY: (const half*, const half*, float*), 16x16 each, one warp.
    unsafe { l.launch(&cfg, &mut args) }.map_err(|e| e.to_string())?;
    drop(args);
    let c = g.down(&cb)?;
    // C[m][n] = sum_k I[m][k] * B[k][n] = B[m][n]; B col-major: B[k][n] = b[k + 16 n].
    let ok = (0..16).all(|m| (0..16).all(|n| c[m * 16 + n] == b_vals[m + 16 * n]));
    check("wmma_16x16x16_f16", ok)
}

fn check(what: &str, ok: bool) -> Result<()> {
    if ok {
        println!("gpu ok {what}");
        Ok(())
    } else {
        Err(format!("{what}: wrong results"))
    }
}

/// Exit code: 0 when every kernel checked out, 1 otherwise, 2 without a GPU.
pub fn run() -> i32 {
    let ctx = match GpuContext::default() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let pool = match MemoryPool::cuda(&ctx, PoolConfig::default()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let t = Transfer::new(&ctx);
    let g = Gpu { ctx, pool, t };
    println!("gpu {}", g.ctx.arch());
    let mut failed = 0;
    for (name, f) in [
        ("affine_f32", affine_f32 as fn(&Gpu) -> Result<()>),
        ("saturate_abs_i32", saturate_abs),
        ("fill_zero_f32", fill_zero),
        ("affine_bf16", affine_bf16),
        ("quantize<float>", quantize),
        ("wmma_16x16x16_f16", wmma),
    ] {
        if let Err(e) = f(&g) {
            eprintln!("gpu FAILED {name}: {e}");
            failed += 1;
        }
    }
    i32::from(failed > 0)
}
