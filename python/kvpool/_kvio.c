/*
 * kvpool._kvio: kvpool.Pool's single-key get_into and put without ctypes.
 *
 * Why.  Through ctypes one call builds four structs and takes the buffer
 * through ctypes.pythonapi: 3-6 us a call (the interpreter's build decides),
 * 4-8 % of a 1 MiB get.  Here the argument parsing takes the buffer (s*, w*)
 * and the call is the C one with the GIL released: about 1 us.  Only the
 * common case comes here (a str or bytes key, a buffer-protocol value);
 * kvpool/pool.py keeps the ctypes path for the rest (torch tensors, which
 * have no buffer protocol) and for every error message, so both paths give
 * the same answers.  The library's symbols come from the libkvpool.so that
 * kvpool/_lib.py loads with RTLD_GLOBAL (nothing is linked here).
 *
 * Both return (call status, key status, flags, size) as ints: the caller
 * raises.  A buffer the parser refuses (read-only for get_into,
 * non-contiguous, no buffer protocol) is a TypeError or BufferError, which
 * tells pool.py to take the ctypes path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>

#include "kvpool/pool.h"

static PyObject *io_call(PyObject *args, const char *fmt, bool get)
{
    unsigned long long h;
    Py_buffer key, val;
    if (!PyArg_ParseTuple(args, fmt, &h, &key, &val))
        return NULL;
    kvp_status_t st;
    kvp_key_result_t r = {0};
    if (!h || key.len > UINT32_MAX) {
        st = h ? KVP_ERR_KEY_LENGTH : KVP_ERR_NULL_POINTER;
    } else {
        kvp_key_t k = {key.buf, (uint32_t)key.len};
        kvp_iov_t iov = {val.buf, (size_t)val.len};
        kvp_sgl_t sgl = {&iov, 1};
        Py_BEGIN_ALLOW_THREADS
        st = get ? kvp_pool_get((kvp_pool_t *)(uintptr_t)h, &k, &sgl, 1, &r)
                 : kvp_pool_put((kvp_pool_t *)(uintptr_t)h, &k, &sgl, 1, &r);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&val);
    return Py_BuildValue("(iiIK)", (int)st, (int)r.status, (unsigned)r.flags,
                         (unsigned long long)r.size);
}

static PyObject *io_get_into(PyObject *mod, PyObject *args)
{
    (void)mod;
    return io_call(args, "Ks*w*", true);
}

static PyObject *io_put(PyObject *mod, PyObject *args)
{
    (void)mod;
    return io_call(args, "Ks*y*", false);
}

static PyMethodDef io_methods[] = {
    {"get_into", io_get_into, METH_VARARGS,
     "(pool handle, key, writable buffer) -> (status, key status, flags, size)"},
    {"put", io_put, METH_VARARGS, "(pool handle, key, buffer) -> (status, key status, flags, size)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef io_module = {
    PyModuleDef_HEAD_INIT, "kvpool._kvio", "kvpool.Pool's single-key fast path.", -1, io_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kvio(void)
{
    return PyModule_Create(&io_module);
}
