//! The device-local memory an adapter reports, for the default memory budget. wgpu has no
//! such query; on Vulkan it is read through wgpu's hal access: the largest `DEVICE_LOCAL`
//! memory heap and, where the driver has `VK_EXT_memory_budget`, what this process may
//! allocate from it now. Other backends report nothing (the budget keeps its fallback rule).

/// Device-local memory of an adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceMemory {
    /// Size of the largest device-local heap, in bytes.
    pub heap_bytes: u64,
    /// What this process may allocate from that heap now (`VK_EXT_memory_budget`), in bytes.
    pub budget_bytes: Option<u64>,
}

impl DeviceMemory {
    /// The bytes a decode may plan for: 90 % of the budget (or of the heap without one),
    /// leaving room for the driver and the rest of the application.
    pub(crate) fn usable_bytes(&self) -> u64 {
        self.budget_bytes
            .unwrap_or(self.heap_bytes)
            .min(self.heap_bytes)
            / 10
            * 9
    }
}

/// The adapter's device-local memory, where its backend reports it.
pub(crate) fn of_adapter(adapter: &wgpu::Adapter) -> Option<DeviceMemory> {
    #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
    if adapter.get_info().backend == wgpu::Backend::Vulkan {
        return vulkan(adapter);
    }
    let _ = adapter;
    None
}

#[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
fn vulkan(adapter: &wgpu::Adapter) -> Option<DeviceMemory> {
    use ash::vk;
    // SAFETY: read-only queries of the adapter's physical device; the hal guard keeps the
    // adapter alive while they run, and nothing is created or destroyed.
    unsafe {
        let hal = adapter.as_hal::<wgpu::hal::api::Vulkan>()?;
        let shared = hal.shared_instance();
        let instance = shared.raw_instance();
        let pd = hal.raw_physical_device();
        let props = instance.get_physical_device_memory_properties(pd);
        let count = (props.memory_heap_count as usize).min(props.memory_heaps.len());
        let (index, heap) = props.memory_heaps[..count]
            .iter()
            .enumerate()
            .filter(|(_, h)| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .max_by_key(|(_, h)| h.size)?;
        let budget = if shared.instance_api_version() >= vk::API_VERSION_1_1
            && hal
                .physical_device_capabilities()
                .supports_extension(ash::ext::memory_budget::NAME)
        {
            let mut b = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
            let mut p2 = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut b);
            instance.get_physical_device_memory_properties2(pd, &mut p2);
            b.heap_budget.get(index).copied().filter(|v| *v > 0)
        } else {
            None
        };
        Some(DeviceMemory {
            heap_bytes: heap.size,
            budget_bytes: budget,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usable_bytes_leave_a_tenth() {
        let gib = 1u64 << 30;
        let m = DeviceMemory {
            heap_bytes: 8 * gib,
            budget_bytes: None,
        };
        assert_eq!(m.usable_bytes(), 8 * gib / 10 * 9);
        let b = DeviceMemory {
            heap_bytes: 8 * gib,
            budget_bytes: Some(6 * gib),
        };
        assert_eq!(b.usable_bytes(), 6 * gib / 10 * 9);
    }

    /// Lavapipe (CI) is a Vulkan adapter with a device-local heap.
    #[test]
    fn vulkan_adapters_report_their_heap() {
        let instance = wgpu::Instance::default();
        for a in pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN)) {
            let m = of_adapter(&a).expect("a Vulkan adapter has a device-local heap");
            assert!(m.heap_bytes > 0, "{:?}", a.get_info().name);
            eprintln!("{}: {m:?}", a.get_info().name);
        }
    }
}
