//! The Vulkan loader and instance: `libvulkan.so.1` is opened at run time (`Entry::load`), so
//! the plugin loads, and simply reports "no GPU", on systems without Vulkan.

use std::ffi::CStr;

use ash::vk;

use super::VkError;

/// The lowest Vulkan version the engine asks for: 1.1 gives `vkGetPhysicalDeviceFeatures2` and
/// subgroup properties in core.
pub const API_VERSION: u32 = vk::API_VERSION_1_1;

/// Loader + instance. Dropping it destroys the instance, then unloads the library (field order).
pub struct InstanceShared {
    pub(crate) instance: ash::Instance,
    /// Keeps `libvulkan` loaded for as long as the instance lives; dropped after it.
    pub(crate) _entry: ash::Entry,
}

impl InstanceShared {
    /// Loads the loader and creates an instance. `Ok(None)` (with one log line) when the loader
    /// is missing, too old, or has no driver at all.
    pub fn new() -> Result<Option<Self>, VkError> {
        // SAFETY: loading libvulkan runs its initialisers; the loader is a well-behaved system
        // library and the returned `Entry` keeps it loaded for as long as we use its pointers.
        let entry = match unsafe { ash::Entry::load() } {
            Ok(e) => e,
            Err(e) => {
                log::info!("vk: no Vulkan loader ({e}); GPU decode disabled");
                return Ok(None);
            }
        };
        // SAFETY: plain query on a valid entry.
        let version = match unsafe { entry.try_enumerate_instance_version() } {
            Ok(v) => v.unwrap_or(vk::API_VERSION_1_0),
            Err(result) => return Err(VkError::Call { call: "vkEnumerateInstanceVersion", result }),
        };
        if version < API_VERSION {
            log::info!("vk: Vulkan loader is {}.{}, need 1.1; GPU decode disabled", vk::api_version_major(version), vk::api_version_minor(version));
            return Ok(None);
        }
        let app_name: &CStr = c"ggml-ork";
        let app = vk::ApplicationInfo::default()
            .application_name(app_name)
            .engine_name(app_name)
            .api_version(API_VERSION);
        let info = vk::InstanceCreateInfo::default().application_info(&app);
        // SAFETY: `info` and everything it points to live across the call.
        let instance = match unsafe { entry.create_instance(&info, None) } {
            Ok(i) => i,
            Err(vk::Result::ERROR_INCOMPATIBLE_DRIVER) => {
                log::info!("vk: Vulkan loader has no usable driver; GPU decode disabled");
                return Ok(None);
            }
            Err(result) => return Err(VkError::Call { call: "vkCreateInstance", result }),
        };
        Ok(Some(Self { instance, _entry: entry }))
    }
}

impl Drop for InstanceShared {
    fn drop(&mut self) {
        // SAFETY: every child object (the device) holds an Arc to us and is gone by now.
        unsafe { self.instance.destroy_instance(None) };
    }
}
