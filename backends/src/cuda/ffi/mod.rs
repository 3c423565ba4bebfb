//! Everything `unsafe` about CUDA: the driver calls (through `cudarc`'s thin `result`/`sys` layers), the
//! raw device and pinned pointers, and the rules that make asynchronous copies sound. Every `unsafe` block
//! says why it is sound in a `// SAFETY:` comment; the modules outside `ffi` use only what it exports.

mod device;
mod ipc;
mod memory;
mod slot;
mod stream;

pub use device::{Gpu, device_count, driver_present};
pub use ipc::{IPC_HANDLE_LEN, IpcExport, IpcMapping, export};
pub use memory::{CallerDeviceMemory, DeviceMemory, PinnedHostMemory};
pub use slot::PinnedSlot;
pub(crate) use stream::{DeviceSpan, Pending, Stream};

use cudarc::driver::DriverError;

use super::CudaError;

/// Wraps a driver error with the name of the call that returned it.
fn driver(call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
    move |e| {
        let message = match (e.error_name(), e.error_string()) {
            (Ok(name), Ok(text)) => {
                format!("{} ({})", name.to_string_lossy(), text.to_string_lossy())
            }
            _ => format!("{:?}", e.0),
        };
        CudaError::Driver { call, message }
    }
}
