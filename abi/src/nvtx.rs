//! `nvToolsExt.h` (NVTX v2, also declared identically by `nvtx3/nvToolsExt.h`): the NVIDIA Tools
//! Extension's types and constants.
//!
//! The v2 entry points live in `libnvToolsExt.so.1`; NVTX 3 is header-only and reaches a tool
//! through an injection library instead, but keeps these types and the calling convention.
use core::ffi::{c_char, c_uint, c_void};

crate::opaque_struct!(
    /// Pointee of `nvtxStringHandle_t` (`struct nvtxStringHandle`).
    nvtxStringHandle
);
crate::opaque_struct!(
    /// Pointee of `nvtxDomainHandle_t` (`struct nvtxDomainHandle`).
    nvtxDomainHandle
);
crate::opaque_struct!(
    /// Pointee of `nvtxResourceHandle_t` (`struct nvtxResourceHandle`).
    nvtxResourceHandle
);

/// C's `wchar_t` on Linux: a 32-bit signed integer on x86_64, unsigned on aarch64.
#[cfg(not(target_arch = "aarch64"))]
pub type wchar_t = i32;
/// C's `wchar_t` on Linux: a 32-bit signed integer on x86_64, unsigned on aarch64.
#[cfg(target_arch = "aarch64")]
pub type wchar_t = u32;

/// The id of a start/end range (`nvtxRangeStartA` ... `nvtxRangeEnd`).
pub type nvtxRangeId_t = u64;
/// A string registered with `nvtxDomainRegisterStringA/W`.
pub type nvtxStringHandle_t = *mut nvtxStringHandle;
/// A domain made by `nvtxDomainCreateA/W`; null is the default domain.
pub type nvtxDomainHandle_t = *mut nvtxDomainHandle;
/// A resource made by `nvtxDomainResourceCreate`.
pub type nvtxResourceHandle_t = *mut nvtxResourceHandle;

/// `enum nvtxColorType_t` (stored in an `int32_t` field of the attribute structures).
pub type nvtxColorType_t = c_uint;
pub const NVTX_COLOR_UNKNOWN: nvtxColorType_t = 0;
pub const NVTX_COLOR_ARGB: nvtxColorType_t = 1;

/// `enum nvtxMessageType_t`.
pub type nvtxMessageType_t = c_uint;
pub const NVTX_MESSAGE_UNKNOWN: nvtxMessageType_t = 0;
pub const NVTX_MESSAGE_TYPE_ASCII: nvtxMessageType_t = 1;
pub const NVTX_MESSAGE_TYPE_UNICODE: nvtxMessageType_t = 2;
pub const NVTX_MESSAGE_TYPE_REGISTERED: nvtxMessageType_t = 3;

/// `enum nvtxPayloadType_t`.
pub type nvtxPayloadType_t = c_uint;
pub const NVTX_PAYLOAD_UNKNOWN: nvtxPayloadType_t = 0;
pub const NVTX_PAYLOAD_TYPE_UNSIGNED_INT64: nvtxPayloadType_t = 1;
pub const NVTX_PAYLOAD_TYPE_INT64: nvtxPayloadType_t = 2;
pub const NVTX_PAYLOAD_TYPE_DOUBLE: nvtxPayloadType_t = 3;
pub const NVTX_PAYLOAD_TYPE_UNSIGNED_INT32: nvtxPayloadType_t = 4;
pub const NVTX_PAYLOAD_TYPE_INT32: nvtxPayloadType_t = 5;
pub const NVTX_PAYLOAD_TYPE_FLOAT: nvtxPayloadType_t = 6;

/// `enum nvtxInitializationMode_t`.
pub type nvtxInitializationMode_t = c_uint;
pub const NVTX_INITIALIZATION_MODE_UNKNOWN: nvtxInitializationMode_t = 0;
pub const NVTX_INITIALIZATION_MODE_CALLBACK_V1: nvtxInitializationMode_t = 1;
pub const NVTX_INITIALIZATION_MODE_CALLBACK_V2: nvtxInitializationMode_t = 2;

/// `enum nvtxResourceGenericType_t` (the `identifierType` of `nvtxResourceAttributes_t`).
pub type nvtxResourceGenericType_t = c_uint;
pub const NVTX_RESOURCE_TYPE_UNKNOWN: nvtxResourceGenericType_t = 0;
pub const NVTX_RESOURCE_TYPE_GENERIC_POINTER: nvtxResourceGenericType_t = 0x10000 + 1;
pub const NVTX_RESOURCE_TYPE_GENERIC_HANDLE: nvtxResourceGenericType_t = 0x10000 + 2;
pub const NVTX_RESOURCE_TYPE_GENERIC_THREAD_NATIVE: nvtxResourceGenericType_t = 0x10000 + 3;
pub const NVTX_RESOURCE_TYPE_GENERIC_THREAD_POSIX: nvtxResourceGenericType_t = 0x10000 + 4;

/// `NVTX_VERSION`: the API version these structures belong to.
pub const NVTX_VERSION: u16 = 2;
/// `NVTX_NO_PUSH_POP_TRACKING`: what push/pop return when no tool tracks ranges.
pub const NVTX_NO_PUSH_POP_TRACKING: i32 = -2;
/// `NVTX_EVENT_ATTRIB_STRUCT_SIZE`.
pub const NVTX_EVENT_ATTRIB_STRUCT_SIZE: u16 = core::mem::size_of::<nvtxEventAttributes_t>() as u16;
/// `NVTX_INITIALIZATION_ATTRIB_STRUCT_SIZE`.
pub const NVTX_INITIALIZATION_ATTRIB_STRUCT_SIZE: u16 =
    core::mem::size_of::<nvtxInitializationAttributes_t>() as u16;
/// `NVTX_RESOURCE_ATTRIB_STRUCT_SIZE`.
pub const NVTX_RESOURCE_ATTRIB_STRUCT_SIZE: u16 =
    core::mem::size_of::<nvtxResourceAttributes_t>() as u16;

/// `union nvtxMessageValue_t`: the message of an event, as selected by `messageType`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union nvtxMessageValue_t {
    pub ascii: *const c_char,
    pub unicode: *const wchar_t,
    pub registered: nvtxStringHandle_t,
}

/// `union payload_t`, declared inside `nvtxEventAttributes_v2`: selected by `payloadType`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union payload_t {
    pub ullValue: u64,
    pub llValue: i64,
    pub dValue: f64,
    pub uiValue: u32,
    pub iValue: i32,
    pub fValue: f32,
}

/// `struct nvtxEventAttributes_v2`: the attributes of a mark or range (`...Ex` entry points).
/// Callers set `version = NVTX_VERSION` and `size = NVTX_EVENT_ATTRIB_STRUCT_SIZE`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvtxEventAttributes_v2 {
    pub version: u16,
    pub size: u16,
    pub category: u32,
    /// An `nvtxColorType_t`.
    pub colorType: i32,
    pub color: u32,
    /// An `nvtxPayloadType_t`.
    pub payloadType: i32,
    pub reserved0: i32,
    pub payload: payload_t,
    /// An `nvtxMessageType_t`.
    pub messageType: i32,
    pub message: nvtxMessageValue_t,
}
/// `nvtxEventAttributes_t`.
pub type nvtxEventAttributes_t = nvtxEventAttributes_v2;

/// `struct nvtxInitializationAttributes_v2` (argument of `nvtxInitialize`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvtxInitializationAttributes_v2 {
    pub version: u16,
    pub size: u16,
    /// An `nvtxInitializationMode_t`.
    pub mode: u32,
    pub fnptr: Option<unsafe extern "C" fn()>,
}
/// `nvtxInitializationAttributes_t`.
pub type nvtxInitializationAttributes_t = nvtxInitializationAttributes_v2;

/// `union identifier_t`, declared inside `nvtxResourceAttributes_v0`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union identifier_t {
    pub pValue: *const c_void,
    pub ullValue: u64,
}

/// `struct nvtxResourceAttributes_v0` (argument of `nvtxDomainResourceCreate`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvtxResourceAttributes_v0 {
    pub version: u16,
    pub size: u16,
    /// An `nvtxResource*Type_t`.
    pub identifierType: i32,
    pub identifier: identifier_t,
    /// An `nvtxMessageType_t`.
    pub messageType: i32,
    pub message: nvtxMessageValue_t,
}
/// `nvtxResourceAttributes_t`.
pub type nvtxResourceAttributes_t = nvtxResourceAttributes_v0;

impl Default for nvtxEventAttributes_v2 {
    /// Zeroed, with `version` and `size` set as the header asks callers to.
    fn default() -> Self {
        Self {
            version: NVTX_VERSION,
            size: NVTX_EVENT_ATTRIB_STRUCT_SIZE,
            category: 0,
            colorType: 0,
            color: 0,
            payloadType: 0,
            reserved0: 0,
            payload: payload_t { ullValue: 0 },
            messageType: 0,
            message: nvtxMessageValue_t {
                ascii: core::ptr::null(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_attributes_layout_matches_the_header() {
        // 64-bit Linux: 2+2+4+4+4+4+4 = 24, payload (8) at 24, messageType at 32, message at 40.
        assert_eq!(core::mem::size_of::<nvtxEventAttributes_t>(), 48);
        assert_eq!(core::mem::offset_of!(nvtxEventAttributes_t, payload), 24);
        assert_eq!(core::mem::offset_of!(nvtxEventAttributes_t, message), 40);
        assert_eq!(NVTX_EVENT_ATTRIB_STRUCT_SIZE, 48);
    }
}
