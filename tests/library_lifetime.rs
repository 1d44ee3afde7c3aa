//! NVIDIA's libraries stay loaded once opened, whatever handles are
//! dropped.
//!
//! NVRTC and nvJitLink register `pthread_key_create` destructors that live
//! in their own code and run when a thread that used them exits. Nothing
//! keeps a library mapped for those: had dropping the last handle unloaded
//! it, a thread exiting afterwards would jump into unmapped code. That was
//! the rare SIGSEGV of a CI run of tests/builder.rs (stop 28): a scoped
//! compile thread still exiting after `std::thread::scope` had returned and
//! the builder had dropped NVRTC. The loader now makes the library it
//! accepts (and NVRTC's builtins) resident, `RTLD_NODELETE`, as a process
//! that links them would keep them.
//!
//! The test makes that order certain: a thread compiles and links, every
//! handle is dropped, and only then does the thread exit. It must be the
//! only test in this binary, so that no other test holds the libraries.
//! No GPU is needed.

use std::sync::mpsc;

use fraglink::sys::{InputType, NvJitLink, Nvrtc, Output, SysError};

const SOURCE: &str =
    r#"extern "C" __global__ void lifetime_probe(float* p) { p[threadIdx.x] += 1.0f; }"#;

fn compile_and_link(nvrtc: &Nvrtc, jitlink: &NvJitLink) -> Result<Vec<u8>, SysError> {
    let options = ["-dlto", "-rdc=true", "--gpu-architecture=compute_75"].map(String::from);
    let ir = nvrtc.compile(SOURCE, "lifetime.cu", &options, Output::LtoIr)?;
    let mut link = jitlink.create(&["-arch=sm_75".to_string(), "-lto".to_string()])?;
    link.add(InputType::LtoIr, &ir.bytes, "lifetime")?;
    link.complete()?;
    link.cubin()
}

#[test]
fn a_thread_that_used_the_libraries_may_exit_after_their_last_handle_is_dropped() {
    for round in 0..3 {
        let nvrtc = Nvrtc::open(None).expect("NVRTC (set FRAGLINK_NVRTC_PATH)");
        let jitlink = NvJitLink::open(None).expect("nvJitLink (set FRAGLINK_NVJITLINK_PATH)");
        let (used, exit) = (mpsc::channel(), mpsc::channel::<()>());
        let worker = std::thread::spawn(move || {
            let cubin = compile_and_link(&nvrtc, &jitlink);
            drop((nvrtc, jitlink));
            used.0.send(cubin).unwrap();
            // Exits, running the libraries' thread destructors, only once
            // the main thread says so.
            let _ = exit.1.recv();
        });
        let cubin = used.1.recv().unwrap();
        let cubin = cubin.unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(!cubin.is_empty());
        // Every handle is gone; the libraries must still be mapped.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(
            maps.contains("/libnvrtc.so") && maps.contains("/libnvJitLink.so"),
            "round {round}: a library was unloaded when its last handle was dropped"
        );
        exit.0.send(()).unwrap();
        worker.join().unwrap();
    }
}
