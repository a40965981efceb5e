"""Every message and exit code the fake nvidia-smi prints, in one place.

Texts are copied from real nvidia-smi output (driver 5xx); see README.md for sources.
"""

# nvidia-smi(1) RETURN VALUE (they are NVML return codes; NVML_ERROR_UNKNOWN -> 255).
EXIT_OK = 0
EXIT_INVALID_ARGUMENT = 2
EXIT_NOT_SUPPORTED = 3
EXIT_NO_PERMISSION = 4
EXIT_NOT_FOUND = 6
EXIT_DRIVER_NOT_LOADED = 9
EXIT_LIB_NOT_FOUND = 12
EXIT_GPU_LOST = 15
EXIT_VERSION_MISMATCH = 18
EXIT_OTHER = 255

DRIVER_NOT_LOADED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
NO_DEVICES = "No devices were found"
VERSION_MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"
NVML_LIBRARY_VERSION = "NVML library version: {version}"

# {bus} is the 4-digit-domain form, e.g. 0000:5D:00.0 (no space after "GPU").
HANDLE_UNKNOWN_ERROR = "Unable to determine the device handle for GPU{bus}: Unknown Error"
HANDLE_GPU_LOST = (
    "Unable to determine the device handle for GPU{bus}: GPU is lost.  "
    "Reboot the system to recover this GPU"
)
# nvidia-smi -L: "for gpu" (lower case), smi_errors/E09 and the binaries' strings.
HANDLE_UNKNOWN_ERROR_L = "Unable to determine the device handle for gpu {bus}: Unknown Error"

INVALID_FIELD = 'Field "{field}" is not a valid field to query.\n'
INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
FORMAT_REQUIRED = '"--format" switch is required with "--query-gpu" and "--query-compute-apps".\n'

PM_ENABLED = "Enabled persistence mode for GPU {bus}."
PM_DISABLED = "Disabled persistence mode for GPU {bus}."
PM_ALREADY = "Persistence mode is already {mode} for GPU {bus}."
ALL_DONE = "All done."

RESET_OK = "GPU {bus} was successfully reset."
RESET_FAILED_HEADER = "The following GPUs could not be reset:"
RESET_FAILED_GPU = "  GPU {bus}: In use by another client"
# The same refusal, when the platform refuses the function-level reset itself: NVML's words for the
# GPU in place of "In use by another client" ("Unknown Error" on AWS bare metal and EKS, where the
# hypervisor blocks FLR: NVIDIA/ai-cloud-validation#603; "Not Supported", "Insufficient
# Permissions": nvmlErrorString of NOT_SUPPORTED and NO_PERMISSION). No footer follows it.
RESET_REFUSED_GPU = "  GPU {bus}: {words}"
FLR_REFUSED_WORDS = ("Unknown Error", "Not Supported", "Insufficient Permissions")
RESET_FAILED_FOOTER = (
    "{n} device{s} {verb} currently being used by one or more other processes "
    "(e.g., Fabric Manager, CUDA application, graphics application such as an X server, "
    "or a monitoring application such as another instance of nvidia-smi). Please first "
    "kill all processes using this device and all compute applications running in the system."
)
RESET_NEEDS_ID = "The -r/--gpu-reset option requires the -i/--id option to specify a GPU.\n"

# Values that real drivers print in place of a field.
NA_VALUES = ("[N/A]", "[Not Supported]", "[Insufficient Permissions]", "[Unknown Error]")

# The driver's messages in the kernel log, as /dev/kmsg gives them (see gpusim.kmsg for the
# records around them). The Xid texts follow real reports (NVIDIA's Xid catalogue,
# docs.nvidia.com/deploy/xid-errors; published dmesg output).
XID_MESSAGE = "NVRM: Xid (PCI:{bus}): {code}, {text}"
# A GPU that falls off the bus while the driver probes it: no Xid, three lines
# (kernel_xid/K06 NVIDIA/NVSentinel#155, K07), {bus} as 0000:b3:00.0; and the one-line form (K09).
FALLEN_PROBE = (
    "NVRM: The NVIDIA GPU {bus}",
    "NVRM: (PCI ID: 10de:2335) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
)
FALLEN_LINE = ("NVRM: GPU {bus}: GPU has fallen off the bus.",)
# The driver hung in a full-chip reset: its resource server's assertions on every call, as an RTX
# 5080 host logged them after Xid 119 and 154 (NVIDIA/open-gpu-kernel-modules#1045), "GPU0" being
# the driver's own instance number; some name no GPU.
DRIVER_HUNG_LINES = (
    "NVRM: GPU0 nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || (status == NV_ERR_GPU_IN_FULLCHIP_RESET) "
    "@ mem.c:178",
    "NVRM: GPU0 nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || (status == NV_ERR_GPU_IN_FULLCHIP_RESET) "
    "@ vaspace_api.c:573",
    "NVRM: GPU0 nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || (status == NV_ERR_GPU_IN_FULLCHIP_RESET) "
    "@ rs_client.c:844",
    "NVRM: nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || (status == NV_ERR_GPU_IN_FULLCHIP_RESET) "
    "@ rs_server.c:259",
)
XID_TEXTS = {
    13: "pid=4242, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: ("pid=4242, name=python3, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS "
         "GPCCLIENT_T1_0 faulted @ 0x7f2a_1c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"),
    43: "pid=4242, name=python3, Ch 00000008",
    45: "pid=4242, name=python3, Ch 00000008",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.",
    63: "pid='<unknown>', name=<unknown>, Row Remapper: New row (0x0000000000b45678) marked for remapping, reset gpu to activate.",
    64: "pid='<unknown>', name=<unknown>, Row Remapper: Failed to remap row (0x0000000000b45678)",
    74: "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    94: "pid=4242, name=python3, Contained: SM (0x1). RST: No, D-RST: No",
    95: "pid=4242, name=python3, Uncontained: FBHUB. RST: Yes, D-RST: No",
    154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
}
XID_TEXT_OTHER = "pid='<unknown>', name=<unknown>, Ch 00000008"

# A GPU whose probe finds it gone at boot: no Xid, the device is not attached (no minor number,
# no /proc/driver/nvidia/gpus entry). Real syslog: shared/real-samples/kernel_xid/K07 (H100,
# 525.125.06); the same three NVRM lines in dmesg: K06 (NVIDIA/NVSentinel#155, 570.158.01).
FALLEN_OFF_BUS_AT_BOOT = (
    "NVRM: The NVIDIA GPU {bus}",
    "NVRM: (PCI ID: {pci_id}) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
    "nvidia: probe of {bus} failed with error -1",
    "NVRM: The NVIDIA probe routine failed for 1 device(s).",
)
# The driver core's line (dev_warn) carries the device in the record's dictionary.
PROBE_FAILED_DICT = ("SUBSYSTEM=pci", "DEVICE=+pci:{bus}")

# /proc/driver/nvidia/gpus/<bus id>/information, as the driver writes it
# (NVIDIA/open-gpu-kernel-modules kernel-open/nvidia/nv-procfs.c, nv_procfs_read_gpu_info:
# "Model: \t\t %s", ..., "Device Minor: \t %u", "GPU Excluded:\t %s"). IRQ, Video BIOS and the
# DMA values are plausible constants, not taken from a real H200.
GPU_INFORMATION = (
    "Model: \t\t {model}\n"
    "IRQ:   \t\t 0\n"
    "GPU UUID: \t {uuid}\n"
    "Video BIOS: \t 96.00.99.00.01\n"
    "Bus Type: \t PCIe\n"
    "DMA Size: \t 52 bits\n"
    "DMA Mask: \t 0xfffffffffffff\n"
    "Bus Location: \t {bus}\n"
    "Device Minor: \t {minor}\n"
    "GPU Excluded:\t No\n"
)

# /proc/driver/nvidia/version of the open kernel module, as NVIDIA's README (Chapter "Open Linux
# Kernel Modules") and public copies show it (nix-community/nixGL#186 on 565.57.01, #121 on
# 525.60.11): "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  <version>  Release Build
# (<builder>)  <date>" and a GCC line. The builder and the date are plausible constants.
DRIVER_VERSION_FILE = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
    "(dvs-builder@U16-A24-9-2)  Thu Oct 10 12:15:00 UTC 2024\n"
    "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n"
)

# `nvidia-smi topo -m`: the header's columns after the GPUs' and the legend after the matrix, as
# drivers 535 and later print them (public captures: luigifcruz/stelline's validated hardware,
# sglang check_env reports; their rows end "<CPUs>\t<node>\t\tN/A"). Some drivers underline the
# header with ANSI escapes even into a pipe: readers strip them; gpusim prints none.
TOPO_AFFINITY_HEADER = "CPU Affinity\tNUMA Affinity\tGPU NUMA ID"
TOPO_LEGEND = (
    "Legend:",
    "",
    "  X    = Self",
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "  PIX  = Connection traversing at most a single PCIe bridge",
    "  NV#  = Connection traversing a bonded set of # NVLinks",
)

# nvidia-smi mig -cgi / -cci, as NVIDIA's MIG user guide prints them (samples/mig/create_instances.txt).
# The failure lines' form is assumed: the samples show no failure.
MIG_GI_CREATED = "Successfully created GPU instance ID {gi:2d} on GPU {gpu:2d} using profile MIG {profile} (ID {id:2d})"
MIG_DEFAULT_CI_CREATED = ("Successfully created compute instance ID {ci:2d} on GPU {gpu:2d} GPU instance ID {gi:2d} "
                          "using profile MIG {profile} (ID {id:2d})")
MIG_CI_CREATED = "Successfully created compute instance on GPU {gpu:2d} GPU instance ID {gi:2d} using profile MIG {profile} (ID {id:2d})"
MIG_GI_FAILED = "Unable to create a GPU instance on GPU {gpu:2d} using profile {profile}: {words}"
MIG_CI_FAILED = "Unable to create a compute instance on GPU {gpu:2d} GPU instance ID {gi:2d} using profile {profile}: {words}"
