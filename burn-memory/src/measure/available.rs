//! Whether a backend can start on this machine, asked before the backend is touched.
//!
//! Why: CubeCL looks for its graphics adapter on a device thread of its own, on the first use
//! of a `Wgpu` device (a tensor, a memory query), and panics there when there is none. The
//! caller then sees only a `RecvError` from a channel, with nothing about what is missing.
//! The same search done here first gives an error that says what to install.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use crate::MemoryError;

/// The name of the adapter Burn's `Wgpu` backend would use for its default device, or
/// [`MemoryError::NoDevice`] saying what to install when there is none: call it before the
/// first use of a `Wgpu` device where no driver may be installed.
///
/// It asks as CubeCL does for `WgpuDevice::DefaultDevice`: the platform's graphics API (Metal
/// on macOS, Vulkan elsewhere), high-performance preference, no fallback adapter.
///
/// ```no_run
/// match burn_memory::wgpu_adapter() {
///     Ok(adapter) => println!("running on {adapter}"),
///     Err(err) => eprintln!("{err}"),
/// }
/// ```
pub fn wgpu_adapter() -> Result<String, MemoryError> {
    let backend = if cfg!(target_os = "macos") {
        wgpu::Backends::METAL
    } else {
        wgpu::Backends::VULKAN
    };
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: backend,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let request = instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        force_fallback_adapter: false,
        compatible_surface: None,
    });
    match ready(request) {
        Ok(adapter) => {
            let info = adapter.get_info();
            Ok(format!(
                "{} ({:?}, {:?})",
                info.name, info.backend, info.device_type
            ))
        }
        Err(err) => Err(MemoryError::NoDevice {
            backend: "wgpu",
            help: format!("{err}. {}", install_hint()),
        }),
    }
}

fn install_hint() -> &'static str {
    if cfg!(target_os = "macos") {
        "Metal is part of macOS: check that this machine has a Metal-capable GPU"
    } else {
        "Install a Vulkan driver: the GPU vendor's, or Mesa's (`apt-get install \
         mesa-vulkan-drivers libvulkan1` on Debian and Ubuntu, `dnf install mesa-vulkan-drivers \
         vulkan-loader` on Fedora), whose lavapipe runs on the CPU; or use a CPU backend"
    }
}

/// The output of a future that native wgpu completes before returning it (its adapter
/// requests do no asynchronous work off the web), without an async runtime.
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut context = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::yield_now();
    }
}
