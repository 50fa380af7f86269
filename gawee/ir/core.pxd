# C declarations of gawee/ir/core.py's Value, Node and Graph for the compiled engine (gawee/accel.py): with them the
# three classes are extension types whose fields a compiled module with a local declared Value, Node or Graph reads
# and writes directly (a struct field, no attribute lookup). A field is typed where core.py only ever stores that
# type in it (a list, a tuple, a dict, a count, another node); the rest hold any Python object. Interpreted, this
# file is not read: the classes' __slots__ name the same fields.

cdef class Node

cdef class Value:
    cdef public list _uses
    cdef public Py_ssize_t _output_refs, output_index
    cdef public Node producer
    cdef public object data, name, type

cdef class Node:
    cdef public tuple _inputs, outputs
    cdef public dict attrs
    cdef public Node _prev, _next
    cdef public double _order
    cdef public Py_ssize_t _queued_in
    cdef public object graph, name, op, source

cdef class Graph:
    cdef public list inputs, _outputs
    cdef public Node _head, _tail
    cdef public Py_ssize_t _len
    cdef public set _names
    cdef public dict _name_counters, meta
    cdef public bint _order_valid
    cdef public object name
    cdef object __weakref__  # a caller may hold a graph weakly (caches, tests of its collection)
