# The extension types gawee/rewrite/driver.py declares its hot locals as (@cython.locals), for the compiled engine.
from gawee.ir.core cimport Node, Value
