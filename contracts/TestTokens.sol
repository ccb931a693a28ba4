// SPDX-License-Identifier: Apache-2.0
// ERC-20 tokens for the chain rail's tests, never deployed anywhere else:
// the standard one, one whose transfer returns no value (as some tokens in
// production do), each refusing one recipient chosen at deployment (a
// transfer to it reverts, as a token's blocklist does).
pragma solidity ^0.8.20;

abstract contract TokenCore {
    string public constant symbol = "STT";
    uint8 public constant decimals = 18;
    uint256 public totalSupply;
    mapping(address => uint256) public balanceOf;
    mapping(address => mapping(address => uint256)) public allowance;
    /// Transfers to this address revert.
    address public immutable refused;

    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);

    constructor(address holder, uint256 supply, address refusedRecipient) {
        refused = refusedRecipient;
        totalSupply = supply;
        balanceOf[holder] = supply;
        emit Transfer(address(0), holder, supply);
    }

    function approve(address spender, uint256 value) external returns (bool) {
        allowance[msg.sender][spender] = value;
        emit Approval(msg.sender, spender, value);
        return true;
    }

    function _spend(address from, uint256 value) internal {
        uint256 allowed = allowance[from][msg.sender];
        if (allowed != type(uint256).max) {
            require(allowed >= value, "allowance exceeded");
            allowance[from][msg.sender] = allowed - value;
        }
    }

    function _move(address from, address to, uint256 value) internal {
        require(to != refused, "recipient refused");
        uint256 balance = balanceOf[from];
        require(balance >= value, "balance exceeded");
        unchecked {
            balanceOf[from] = balance - value;
        }
        balanceOf[to] += value;
        emit Transfer(from, to, value);
    }
}

/// A standard ERC-20: transfer and transferFrom return true.
contract TestToken is TokenCore {
    constructor(address holder, uint256 supply, address refusedRecipient)
        TokenCore(holder, supply, refusedRecipient) {}

    function transfer(address to, uint256 value) external returns (bool) {
        _move(msg.sender, to, value);
        return true;
    }

    function transferFrom(address from, address to, uint256 value) external returns (bool) {
        _spend(from, value);
        _move(from, to, value);
        return true;
    }
}

/// An ERC-20 whose transfer and transferFrom return no value.
contract NoReturnToken is TokenCore {
    constructor(address holder, uint256 supply, address refusedRecipient)
        TokenCore(holder, supply, refusedRecipient) {}

    function transfer(address to, uint256 value) external {
        _move(msg.sender, to, value);
    }

    function transferFrom(address from, address to, uint256 value) external {
        _spend(from, value);
        _move(from, to, value);
    }
}
