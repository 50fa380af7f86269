# C declarations of gawee/rewrite/driver.py for the compiled engine (gawee/accel.py): the Rewriter an extension
# type whose worklist steps are C methods (called without a method lookup), and the extension types its hot locals
# are declared as (@cython.locals). Interpreted, this file is not read.
from gawee.ir.core cimport Node, Value

cdef class Rewriter:
    cdef public object graph, calibration, rules, report, trace, check, budget_per_node, max_firings, device
    cdef object _queue, _instances
    cdef Py_ssize_t _token
    cdef _push(self, Node node)
    cdef _visit(self, phase, Node node)
    cdef list _ordered(self, phase, Node node)
    cpdef bint _try(self, rule, Node node, phase, bint use_guard=*)
    cdef bint _fire(self, rule, list roots, dict env, mctx, phase, bint use_guard)
    cdef _erase_dead(self, Node node)

cdef bint _dead(Node node)
