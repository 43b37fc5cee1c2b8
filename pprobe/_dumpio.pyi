"""Type stub of pprobe/_dumpio.c: the native dump writer and statistics."""

from typing import Any

API: int
#: 1 where crc32 (and the pack writer) fold with PCLMULQDQ and SSE4.1, else 0.
CRC_CLMUL: int

def open(dirfd: int, max_bytes: int, /) -> None: ...
def submit(
    name: str,
    header: bytes,
    data: Any,
    link: str | None,
    wait: bool,
    pack: bool = ...,
    digest: bytes | None = ...,
    /,
) -> bool: ...
def ticket() -> int: ...
def wait(ticket: int, timeout: float, /) -> bool: ...
def failures() -> list[tuple[str, int, str]]: ...
def counters() -> tuple[int, int, int, int, int, int, int]: ...
def helper_files() -> int:
    """Files written by the second writer thread: a batch's large files (256 KiB and more,
    one file each) are written by the writer and a helper thread together."""

def hold(flag: bool, /) -> None:
    """(tests) While held, the writer takes no job off the queue: the jobs submitted meanwhile
    make one batch once it is released."""

def direct(setting: int = ..., refuse_test: bool = ..., /) -> tuple[int, int, int]:
    """(setting, the folder takes O_DIRECT, files written with O_DIRECT), after setting it
    when given: 0 off, 1 auto (the default), 2 on (PPROBE_DUMP_DIRECT). refuse_test (tests):
    each O_DIRECT open creates the file, then fails with EINVAL, as a file system without
    O_DIRECT may."""

def close(timeout: float, /) -> bool: ...
def digest(buffer: Any, /) -> bytes | None: ...
def crc32(data: Any, value: int = 0, portable: bool = False) -> int:
    """zlib.crc32(data, value) computed by the pack writer's code (tests and benchmarks):
    carry-less multiplication folding where CRC_CLMUL is 1, else (or with portable) the
    slicing-by-8 tables. data: any C-contiguous buffer."""

def stats(array: Any, /) -> tuple | None: ...
def stats_at(address: int, code: int, shape: Any, strides: Any, /) -> tuple | None: ...
def grad_columns(grads: Any, tensor_type: Any, strided: Any, codes: dict, /) -> tuple | None: ...
def stats_tensor(tensor: Any, /) -> tuple | None: ...
def tensor_setup(
    plain: tuple,
    codes: dict,
    strided: Any,
    tf_mode_enabled: Any,
    functorch: Any,
    typestr: dict = ...,
    /,
) -> None:
    """typestr: torch.dtype -> NumPy's type string, for the capsule _C_TENSOR_MEM (the native
    core's dumps of plain CPU tensors)."""
