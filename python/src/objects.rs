//! The memory a Python object holds, for a region registered over it in place: a torch tensor (host or
//! CUDA, any dtype, bfloat16 included), any object with `__cuda_array_interface__` (CuPy, Numba), or a
//! writable, C-contiguous buffer (`bytearray`, numpy arrays, `memoryview`). The object is read here, in
//! Rust, and held (with its buffer export) while the region lives; no address crosses the API.

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use transfer_engine::MemoryRegion;

use crate::buffer;
use crate::errors::config;

/// Where an object's memory lies: host memory, or memory of a CUDA GPU.
struct Located {
    address: usize,
    nbytes: usize,
    device: Option<u32>,
    keepalive: Py<PyAny>,
}

/// A region over the memory `obj` holds (see the [module docs](self)). A read-only, non-contiguous or
/// empty one is a `ConfigurationError` (a `ValueError`); an object holding no memory a `TypeError`.
pub(crate) fn memory_of(obj: &Bound<'_, PyAny>) -> PyResult<MemoryRegion> {
    let at = locate(obj)?;
    buffer::region(at.address, at.nbytes, at.keepalive, at.device)
}

fn locate(obj: &Bound<'_, PyAny>) -> PyResult<Located> {
    if obj.hasattr("data_ptr")? && obj.hasattr("is_cuda")? && obj.hasattr("element_size")? {
        return torch_tensor(obj);
    }
    if let Ok(cai) = obj.getattr("__cuda_array_interface__") {
        return cuda_array(obj, &cai);
    }
    host_buffer(obj)
}

/// A torch tensor: its `data_ptr`, on the host or its CUDA device (torch's own array interface refuses
/// bfloat16, the usual KV dtype, so the tensor is asked directly).
fn torch_tensor(t: &Bound<'_, PyAny>) -> PyResult<Located> {
    if !t.call_method0("is_contiguous")?.extract::<bool>()? {
        return Err(config("the tensor is not contiguous"));
    }
    let numel: usize = t.call_method0("numel")?.extract()?;
    let size: usize = t.call_method0("element_size")?.extract()?;
    let nbytes = numel * size;
    if nbytes == 0 {
        return Err(config("the tensor is empty"));
    }
    let device = if t.getattr("is_cuda")?.extract::<bool>()? {
        let index: Option<u32> = t.getattr("device")?.getattr("index")?.extract()?;
        Some(index.unwrap_or(0))
    } else {
        None
    };
    Ok(Located {
        address: t.call_method0("data_ptr")?.extract()?,
        nbytes,
        device,
        keepalive: t.clone().unbind(),
    })
}

/// An object with `__cuda_array_interface__` (version 2 or 3): C-contiguous, writable, non-empty.
fn cuda_array(obj: &Bound<'_, PyAny>, cai: &Bound<'_, PyAny>) -> PyResult<Located> {
    let (address, readonly): (usize, bool) = cai.get_item("data")?.extract()?;
    if readonly {
        return Err(config(
            "the CUDA array is read-only: the engine writes into registered memory",
        ));
    }
    let shape: Vec<usize> = cai.get_item("shape")?.extract()?;
    let typestr: String = cai.get_item("typestr")?.extract()?;
    let itemsize: usize = typestr
        .get(2..)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| {
            config(format!(
                "the CUDA array's typestr {typestr:?} names no item size"
            ))
        })?;
    let nbytes = shape.iter().product::<usize>() * itemsize;
    if let Ok(strides) = cai.get_item("strides")
        && !strides.is_none()
    {
        let strides: Vec<usize> = strides.extract()?;
        let mut step = itemsize;
        for (n, s) in shape.iter().zip(strides).rev() {
            if *n > 1 && s != step {
                return Err(config("the CUDA array is not C-contiguous"));
            }
            step *= n;
        }
    }
    if nbytes == 0 {
        return Err(config("the CUDA array is empty"));
    }
    let device = obj.getattr("device").ok();
    let ordinal = device
        .as_ref()
        .and_then(|d| d.getattr("index").or_else(|_| d.getattr("id")).ok())
        .and_then(|i| i.extract::<Option<u32>>().ok().flatten());
    Ok(Located {
        address,
        nbytes,
        device: Some(ordinal.unwrap_or(0)),
        keepalive: obj.clone().unbind(),
    })
}

/// A writable, C-contiguous buffer: exported as a `memoryview`, its address read through a `ctypes`
/// array made `from_buffer` (which holds the export, so the object can be neither resized nor freed).
fn host_buffer(obj: &Bound<'_, PyAny>) -> PyResult<Located> {
    let py = obj.py();
    let builtins = py.import("builtins")?;
    let view = builtins.getattr("memoryview")?.call1((obj,))?;
    if view.getattr("readonly")?.extract::<bool>()? {
        return Err(config(
            "the buffer is read-only: the engine writes into registered memory",
        ));
    }
    if !view.getattr("c_contiguous")?.extract::<bool>()? {
        return Err(config("the buffer is not C-contiguous"));
    }
    let view = view.call_method1("cast", ("B",))?;
    let nbytes: usize = view.getattr("nbytes")?.extract()?;
    if nbytes == 0 {
        return Err(config("the buffer is empty"));
    }
    let ctypes = py.import("ctypes")?;
    let array_type = ctypes
        .getattr("c_char")?
        .call_method1("__mul__", (nbytes,))?;
    let array = array_type.call_method1("from_buffer", (&view,))?;
    let address: usize = ctypes.call_method1("addressof", (&array,))?.extract()?;
    let keepalive = PyTuple::new(py, [array, view, obj.clone()])?;
    Ok(Located {
        address,
        nbytes,
        device: None,
        keepalive: keepalive.into_any().unbind(),
    })
}
