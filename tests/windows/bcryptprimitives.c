/*
 * bcryptprimitives.dll for Wine 8, which lacks it: Rust's standard library imports
 * ProcessPrng from it (Windows 10 and later have it). Built with mingw-w64 by
 * tests/windows_run.sh and put beside the test executables under Wine only; real Windows
 * has its own, and no shipped binary carries this one.
 *
 * ProcessPrng fills the buffer from RtlGenRandom (advapi32's SystemFunction036), the same
 * system generator; it cannot fail on Windows, and returns TRUE.
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG chunk = len > 0x7fffffff ? 0x7fffffff : (ULONG)len;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        len -= chunk;
    }
    return TRUE;
}
