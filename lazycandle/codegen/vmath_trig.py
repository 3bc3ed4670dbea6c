def sin(v, x): raise NotImplementedError
def cos(v, x): raise NotImplementedError
