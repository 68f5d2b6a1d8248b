"""Compile generated source, cache it on disk, load it and call it with torch tensors."""
from cocktailer.runtime.compiler import CompilerNotFound, compile_shared_library, find_compiler
from cocktailer.runtime.native import CompiledProgram, default_workers

__all__ = ["CompiledProgram", "CompilerNotFound", "compile_shared_library", "default_workers", "find_compiler"]
